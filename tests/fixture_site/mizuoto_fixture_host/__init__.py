"""A configurable engine for the host tests, installed as a real distribution.

``params["mode"]`` (and load options) pick a behaviour; ``engine.EVENTS`` records what the
engine saw, in order, so tests can assert laziness, cleanup, modes and threads. The
``host_engine`` fixture in ``tests/conftest.py`` clears ``EVENTS`` before each test.
"""
