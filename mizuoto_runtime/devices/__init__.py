"""Devices: what a device offers (memory, dtypes), the dtype rules kept as data, and the probe
that asks the drivers without importing torch."""
