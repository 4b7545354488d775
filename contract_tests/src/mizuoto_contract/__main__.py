"""``python -m mizuoto_contract``: the ``mizuoto-contract`` command."""

from mizuoto_contract.cli import run

run()
