"""Decode steps captured as CUDA graphs (``compute.cuda_graphs``), replaying what eager runs.

A small decoder's step is a few hundred tiny kernels whose launch cost exceeds their work; a CUDA
graph launches them all at once. Practice that keeps replay bitwise equal to eager (gpt-fast,
sglang, vLLM and the ``torch.cuda.graph`` rules):

- capture exactly the eager shapes (one graph per batch size, no padding of the batch), over a
  ``BufferCache`` whose buffers never move, with the position read on the device;
- warm up on the capture stream before capturing; the step must be idempotent for equal inputs
  (it may write a cache slot, never accumulate), and the generator's state is put back after
  warm-up, so warm-up draws nothing from the request;
- register the request's generator with the graph (``register_generator_state``) so replayed
  draws continue its stream exactly as eager draws would;
- copy inputs into static buffers, replay, clone the outputs (the next replay overwrites them).

Off CUDA, or when capture is impossible, the same objects run the step eagerly and say why in
``ctx.applied["cuda_graphs"]``; a failed capture is a warning, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from mizuoto_runtime.context import RequestContext, current_context

if TYPE_CHECKING:
    from torch.cuda import _POOL_HANDLE

__all__ = ["GRAPHS", "Graphs"]

GRAPHS = "compute.cuda_graphs"
log = logging.getLogger(__name__)


def _note(ctx: RequestContext | None, name: str, what: str) -> None:
    if ctx is not None:
        ctx.applied.setdefault("cuda_graphs", {})[name] = what


class _Captured:
    def __init__(
        self,
        graph: torch.cuda.CUDAGraph,
        inputs: list[Tensor],
        outputs: Tensor | tuple[Tensor, ...],
    ) -> None:
        self.graph, self.inputs, self.outputs = graph, inputs, outputs


class Graphs:
    """``fn(*tensors)`` captured as one CUDA graph per input signature, and replayed.

    ``fn`` returns a tensor or a tuple of tensors; it must be idempotent for equal inputs (see the
    module docstring). ``generator``: the request's CUDA generator, when ``fn`` draws from it.
    Graphs made for one step share ``pool`` (replay them in capture order only).
    """

    def __init__(
        self,
        fn: Callable[..., Tensor | tuple[Tensor, ...]],
        *,
        name: str,
        device: torch.device | str,
        enabled: bool = True,
        generator: torch.Generator | None = None,
        warmup: int = 2,
        pool: _POOL_HANDLE | None = None,
    ) -> None:
        self.fn, self.name, self.generator, self.warmup = fn, name, generator, warmup
        self.device = torch.device(device)
        self.reason: str | None = None  # why the step runs eagerly; None: captured
        if not enabled:
            self.reason = f"{GRAPHS} is off"
        elif self.device.type != "cuda":
            self.reason = f"CUDA graphs need a CUDA device; ran eagerly on {self.device.type}"
        elif generator is not None and not hasattr(
            torch.cuda.CUDAGraph, "register_generator_state"
        ):
            self.reason = "this torch cannot register a private generator with a graph (< 2.4)"
        self._pool = pool
        self._captured: dict[tuple, _Captured] = {}

    @property
    def active(self) -> bool:
        return self.reason is None

    def __call__(self, *inputs: Tensor) -> Tensor | tuple[Tensor, ...]:
        ctx = current_context()
        if not self.active:
            _note(ctx, self.name, f"eager: {self.reason}")
            return self.fn(*inputs)
        key = tuple((tuple(t.shape), t.dtype) for t in inputs)
        entry = self._captured.get(key)
        if entry is None:
            try:
                entry = self._capture(key, inputs)
            except Exception as error:  # capture can fail on ops that are not capturable
                self.reason = f"capture failed ({type(error).__name__}: {error}); ran eagerly"
                message = f"{GRAPHS} at {self.name}: {self.reason}"
                if ctx is not None:
                    ctx.warn(message)
                else:
                    log.warning("%s", message)
                _note(ctx, self.name, f"eager: {self.reason}")
                return self.fn(*inputs)
        for static, value in zip(entry.inputs, inputs, strict=True):
            static.copy_(value)
        entry.graph.replay()
        _note(ctx, self.name, f"replayed ({len(self._captured)} graph(s))")
        outputs = entry.outputs
        if isinstance(outputs, tuple):
            return tuple(out.clone() for out in outputs)
        return outputs.clone()

    def _capture(self, key: tuple, inputs: Sequence[Tensor]) -> _Captured:
        static = [t.clone() for t in inputs]
        state = None if self.generator is None else self.generator.get_state()
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(self.warmup):
                self.fn(*static)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self.generator is not None and state is not None:
            self.generator.set_state(state)  # warm-up draws are not the request's draws
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        if self.generator is not None:
            graph.register_generator_state(self.generator)
        with torch.cuda.graph(graph, pool=self._pool, stream=stream):
            outputs = self.fn(*static)
        entry = _Captured(graph, static, outputs)
        self._captured[key] = entry
        return entry
