"""Memory management: model handles and their units, the residency policy, placement on the
device, layer streaming from host memory, and the manager that arbitrates between models."""
