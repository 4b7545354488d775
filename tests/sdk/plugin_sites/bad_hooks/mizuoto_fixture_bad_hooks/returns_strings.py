"""A hook that returns a list of strings."""

from mizuoto_sdk import hookimpl


@hookimpl
def mizuoto_engines():
    return ["x"]
