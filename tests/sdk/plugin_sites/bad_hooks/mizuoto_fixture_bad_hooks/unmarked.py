"""A hook without ``@hookimpl``."""


def mizuoto_engines():
    return []
