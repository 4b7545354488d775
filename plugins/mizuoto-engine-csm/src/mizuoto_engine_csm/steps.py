"""The backbone's decode step over a static cache, replayed as a CUDA graph when asked.

``compute.kv_cache=static`` gives the backbone a ``BufferCache`` (fixed addresses); with
``compute.cuda_graphs`` too, each frame's backbone step (the summed frame embedding in, the
final-norm hidden state out) is captured once and replayed (``accel.Graphs``), as
``lm.DecoderSteps`` does for token ids. The position is passed on the device and the cache's host
counters move outside the graph, so a replay writes the slot the position names. Off CUDA, over
a dynamic cache, or while layers stream from host memory, the step runs eagerly and
``ctx.applied["cuda_graphs"]["csm.backbone"]`` says why. The depth decoder stays eager: its cache
is new every frame.
"""

from __future__ import annotations

import torch
from torch import Tensor

from mizuoto_runtime.accel.graphs import Graphs
from mizuoto_runtime.lm import BufferCache, CausalDecoder
from mizuoto_runtime.lm.steps import HeldCache, eager_reason
from mizuoto_sdk import RequestContext

NAME = "csm.backbone"


class BackboneSteps:
    """``steps(x [1, 1, hidden], position)`` -> the final-norm hidden state [1, 1, hidden]."""

    def __init__(self, backbone: CausalDecoder, cache: BufferCache, *, enabled: bool) -> None:
        held = HeldCache(cache)
        self.cache = cache

        def step(x: Tensor, positions: Tensor) -> Tensor:
            return backbone(None, held, inputs_embeds=x, positions=positions, output="hidden")

        why = eager_reason(backbone, cache) if enabled else None
        self.graphs = Graphs(step, name=NAME, device=backbone.device, enabled=enabled and not why)
        if why is not None:
            self.graphs.reason = f"{why}; ran eagerly"
        self._tensors = list(backbone.parameters())
        self._addresses = self._where()

    def _where(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self._tensors)

    def __call__(self, x: Tensor, position: int) -> Tensor:
        if self.graphs.active and self._where() != self._addresses:
            self.graphs.reason = "the weights moved since the graph was captured; ran eagerly"
        positions = torch.full((1, 1), position, dtype=torch.long, device=x.device)
        self.cache.begin(1)
        out = self.graphs(x, positions)
        self.cache.advance(1)
        assert isinstance(out, Tensor)  # step returns one tensor
        return out


def backbone_cache(
    backbone: CausalDecoder, length: int, ctx: RequestContext
) -> tuple[object, BackboneSteps | None]:
    """The request's cache for ``length`` positions, and the replayed step when it asks for
    CUDA graphs over a static one (None: call the backbone on the cache directly)."""
    kind = ctx.compute.kv_cache
    ctx.applied["kv_cache"] = kind
    cache = backbone.new_cache(kind, max_length=length)
    if not ctx.compute.cuda_graphs:
        return cache, None
    if not isinstance(cache, BufferCache):
        why = "CUDA graphs need compute.kv_cache=static (a fixed-address cache)"
        ctx.applied.setdefault("cuda_graphs", {})[NAME] = f"eager: {why}; ran eagerly"
        ctx.warn(f"compute.cuda_graphs: {why}; ran eagerly")
        return cache, None
    return cache, BackboneSteps(backbone, cache, enabled=True)
