"""Plugins and engines that misbehave on purpose, installed by the tests as a real distribution.

The folder above holds their dist-info, so a test puts it on the path (in process, or with
PYTHONPATH for a ``mizuoto`` subprocess) and picks distributions with ``MIZUOTO_PLUGINS``.
"""
