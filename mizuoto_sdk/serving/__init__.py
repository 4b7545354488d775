"""Serving a model as replicas: one handle whatever the deployment.

A replica is one complete copy of a model. It runs in this process (inline) or in worker processes
(local), and a dispatcher sends each request whole to one healthy replica. This package knows
nothing about loading engines and never imports torch: the host (``mizuoto_sdk.host``) builds
the replicas and names the function a worker process runs.
"""
