"""load.device: declares cpu, then refuses to load there."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine
from mizuoto_sdk import ComputeUnavailable


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        raise ComputeUnavailable(
            f"{spec.device}: this build has no kernels for it", {"reason": "no_kernels"}
        )
