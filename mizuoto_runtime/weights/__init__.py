"""Weights: reading checkpoints (safetensors, pickled, sharded) and loading them strictly into a
module, inside the file trees a model folder is allowed to name."""
