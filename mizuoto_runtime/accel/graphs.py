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

import torch
from torch import Tensor

from mizuoto_runtime.context import RequestContext, current_context
from mizuoto_runtime.lm.cache import BufferCache
from mizuoto_runtime.lm.decoder import QwenDecoder, layer_forward
from mizuoto_runtime.lm.rope import Rotary
from mizuoto_runtime.sampling import SamplingParams, hf_sample

__all__ = ["GRAPHS", "DecoderSteps", "Graphs", "LayerSteps", "graph_safe"]

GRAPHS = "compute.cuda_graphs"
log = logging.getLogger(__name__)


def _note(ctx: RequestContext | None, name: str, what: str) -> None:
    if ctx is not None:
        ctx.applied.setdefault("cuda_graphs", {})[name] = what


class _Captured:
    def __init__(self, graph: torch.cuda.CUDAGraph, inputs: list[Tensor], outputs) -> None:
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
        pool: object = None,
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

    def __call__(self, *inputs: Tensor):
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
        if state is not None:
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


def graph_safe(params: SamplingParams) -> bool:
    """Whether sampling with ``params`` has fixed shapes and no host data, so it can be captured.

    Repetition penalty, bad words, suppressed tokens and min_new_tokens read the growing token
    history or build index tensors on the host; with them, only the forward is captured and
    sampling runs eagerly after each replay.
    """
    return (
        params.repetition_penalty == 1.0
        and not params.bad_words_ids
        and not params.suppress_tokens
        and not (params.min_new_tokens and params.eos_token_id)
    )


class DecoderSteps:
    """A QwenDecoder's decode step over a BufferCache as one CUDA graph per batch size.

    ``steps(tokens [B, 1], positions [B, 1], padding [B, max_length] or None)`` returns the step's
    float32 logits [B, V] and, when ``params`` are graph-safe, the sampled tokens [B] (drawn in the
    graph from ``generator``); else None, and the caller samples. The cache advances one token per
    call. ``padding`` is the 2D attention mask padded with zeros to the cache length, updated in
    place by the caller.
    """

    def __init__(
        self,
        decoder: QwenDecoder,
        cache: BufferCache,
        *,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        enabled: bool = True,
    ) -> None:
        self.cache = cache
        weights = decoder.weights()
        sample = params is not None and graph_safe(params)
        if sample and params.do_sample and generator is None:
            raise ValueError("DecoderSteps: sampling in the graph needs the request's generator")

        def step(tokens: Tensor, positions: Tensor, padding: Tensor | None = None):
            logits = decoder(
                tokens,
                cache,
                positions=positions,
                padding_mask=padding,
                logits_to_keep=1,
                weights=weights,
                advance=False,
            )
            scores = logits[:, -1].to(copy=True, dtype=torch.float32)  # [B, V]
            if not sample:
                return scores
            return scores, hf_sample(scores, tokens, 1, params, generator)

        if decoder.config.rope.rope_type == "dynamic":
            enabled = False  # its frequencies are decided on the host each step
        self.samples = sample
        self.graphs = Graphs(
            step,
            name="lm.decode",
            device=decoder.device,
            enabled=enabled,
            generator=generator if sample else None,
        )
        if decoder.config.rope.rope_type == "dynamic" and self.graphs.reason == f"{GRAPHS} is off":
            self.graphs.reason = "dynamic NTK RoPE decides its frequencies on the host each step"
        if self.graphs.active and getattr(decoder, "unit_gate", None) is not None:
            self.graphs.reason = "some layers stream from host memory; ran eagerly"
        self._tensors = [t for t in _leaves(weights) if t is not None]
        self._addresses = self._where()

    def _where(self) -> tuple[int, ...]:
        return tuple(t.data_ptr() for t in self._tensors)

    def __call__(
        self, tokens: Tensor, positions: Tensor, padding: Tensor | None = None
    ) -> tuple[Tensor, Tensor | None]:
        if self.graphs.active and self._where() != self._addresses:
            # A graph reads the addresses it saw at capture; the memory manager moved the
            # weights since (offloaded or streamed them), so replaying would read stale memory.
            self.graphs.reason = "the weights moved since the graph was captured; ran eagerly"
        self.cache.begin(1)
        inputs = (tokens, positions) if padding is None else (tokens, positions, padding)
        out = self.graphs(*inputs)
        self.cache.advance(1)
        if self.samples:
            return out
        return out, None


def _leaves(value: object) -> list[Tensor | None]:
    """The tensors of a (nested) weights tuple, in order."""
    if isinstance(value, tuple):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]  # type: ignore[list-item]


class LayerSteps:
    """Each decoder layer's decode step as its own CUDA graph, replayed in order.

    For engines that run something between layers that a graph cannot hold (layers streamed from
    host memory, host-side control): ``steps(x [B, 1, hidden], rotary, mask)`` runs every layer
    on the BufferCache and returns the hidden state; the caller advances the cache.
    """

    def __init__(self, decoder: QwenDecoder, cache: BufferCache, *, enabled: bool = True) -> None:
        weights, config = decoder.weights(), decoder.config
        pool = torch.cuda.graph_pool_handle() if enabled and decoder.device.type == "cuda" else None

        def layer_step(index: int) -> Callable[..., Tensor]:
            def run(x: Tensor, cos: Tensor, signed_sin: Tensor, mask: Tensor) -> Tensor:
                rotary = Rotary(cos, signed_sin)
                return layer_forward(weights.layers[index], x, rotary, mask, cache, index, config)

            return run

        self.layers = [
            Graphs(
                layer_step(i),
                name=f"lm.layer.{i}",
                device=decoder.device,
                enabled=enabled,
                pool=pool,
            )
            for i in range(config.num_hidden_layers)
        ]

    def __call__(self, x: Tensor, rotary: Rotary, mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, rotary.cos, rotary.signed_sin, mask)
        return x
