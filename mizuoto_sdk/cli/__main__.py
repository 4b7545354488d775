"""``python -m mizuoto_sdk.cli``: the ``mizuoto`` command."""

from mizuoto_sdk.cli import run

run()
