"""A plugin module that calls sys.exit when imported."""

import sys

sys.exit(3)
