"""A well-behaved plugin (``plugin``) whose engine (``engine``) is imported only when used."""
