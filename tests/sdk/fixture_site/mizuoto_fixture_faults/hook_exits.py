"""A plugin whose hook calls sys.exit: the listing must record it, not end."""

import sys

from mizuoto_sdk import hookimpl


@hookimpl
def mizuoto_engines():
    sys.exit(4)
