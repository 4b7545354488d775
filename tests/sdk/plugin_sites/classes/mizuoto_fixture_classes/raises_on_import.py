"""An implementation module that raises when imported."""

raise OSError("missing weights")
