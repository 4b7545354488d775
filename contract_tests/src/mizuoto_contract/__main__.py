"""``python -m mizuoto_contract``: the ``mizuoto-contract`` command."""

import sys

from mizuoto_contract.cli import main

sys.exit(main())
