"""determinism.fresh_loads: every load seeds its weights from fresh entropy."""

from __future__ import annotations

import secrets

from mizuoto_broken.base import BaseEngine


class Engine(BaseEngine):
    def weights_seed(self) -> int:
        return secrets.randbits(63)
