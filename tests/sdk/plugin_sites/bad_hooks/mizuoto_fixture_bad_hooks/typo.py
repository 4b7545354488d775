"""A hook whose name is misspelt (``mizuoto_engine``)."""

from mizuoto_sdk import hookimpl


@hookimpl
def mizuoto_engine():
    return []
