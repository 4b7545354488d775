"""A hook that raises."""

from mizuoto_sdk import hookimpl


@hookimpl
def mizuoto_engines():
    raise KeyError("boom")
