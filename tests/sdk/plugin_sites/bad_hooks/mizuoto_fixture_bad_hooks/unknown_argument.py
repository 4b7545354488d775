"""A hook that asks for an argument the spec does not have."""

from mizuoto_sdk import hookimpl


@hookimpl
def mizuoto_engines(registry):
    return []
