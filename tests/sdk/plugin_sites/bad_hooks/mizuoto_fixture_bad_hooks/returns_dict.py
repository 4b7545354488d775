"""A hook that returns a dict instead of a list of manifests."""

from mizuoto_sdk import hookimpl


@hookimpl
def mizuoto_engines():
    return {"id": "x"}
