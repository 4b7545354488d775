"""Plugin modules that fail when imported: each entry point is one way to fail."""
