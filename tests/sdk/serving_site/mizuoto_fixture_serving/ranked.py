"""``ranked``: each chunk is the sum over the dense_tp group of (its rank + 1) / 10, in float32.

With one rank a chunk is all 0.1; with two, all 0.3 (0.1 + 0.2). The call ``ranks`` reports what
this rank's groups say, so a test sees the layout each rank was given.
"""

from __future__ import annotations

import os
import time

import torch

from mizuoto_sdk import AudioChunk, Engine, LoadedEngine


class RankedEngine(Engine):
    def load(self, spec, runtime, ctx):
        return LoadedRanked(runtime.parallel)


class LoadedRanked(LoadedEngine):
    def __init__(self, groups) -> None:
        self.groups = groups

    def synthesize(self, text, params, ctx):
        for index in range(params["chunks"]):
            ctx.check_cancel()
            time.sleep(params["hold"])
            mine = torch.full((160,), (ctx.parallel.rank("dense_tp") + 1) / 10)
            total = ctx.parallel.all_reduce(mine, group="dense_tp")
            yield AudioChunk(total.numpy(), 16000, {"index": index, "pid": os.getpid()})

    def call(self, op, payload, ctx):
        groups = ctx.parallel
        return {
            "world": [groups.rank("world"), groups.size("world")],
            "dense_tp": [groups.rank("dense_tp"), groups.size("dense_tp")],
            "same_as_load": groups is self.groups,
            "pid": os.getpid(),
        }
