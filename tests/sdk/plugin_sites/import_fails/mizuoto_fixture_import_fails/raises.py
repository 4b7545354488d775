"""A plugin module that raises when imported."""

raise RuntimeError("no such backend")
