"""Engines written against newer versions of the engine API: 2.0 (major) and 1.9 (minor)."""
