"""A decoder's decode step captured as CUDA graphs (``accel.graphs.Graphs``).

``DecoderSteps`` captures the whole step, sampling included when the sampling params allow it;
``LayerSteps`` captures each layer on its own, for engines that run something between layers.
Off CUDA both run the same step eagerly.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
from torch import Tensor

from mizuoto_runtime.accel.compile import Compiled
from mizuoto_runtime.accel.graphs import Graphs
from mizuoto_runtime.lm.cache import BufferCache
from mizuoto_runtime.lm.decoder import CausalDecoder, DecoderLayer, layer_forward
from mizuoto_runtime.lm.rope import Rotary
from mizuoto_runtime.sampling import SamplingParams, hf_sample

__all__ = ["DecoderSteps", "HeldCache", "LayerSteps", "eager_reason", "graph_safe"]


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


def eager_reason(decoder: CausalDecoder | Compiled, cache: object) -> str | None:
    """Why ``decoder``'s decode step over ``cache`` cannot be captured on any device, or None.

    The one list of these checks: the decode loop asks it before it builds ``DecoderSteps``
    (and warns), ``DecoderSteps`` asks it again for callers that build one themselves.
    """
    if not isinstance(cache, BufferCache):
        return "CUDA graphs need compute.kv_cache=static (a fixed-address cache)"
    if any(_runs_hooks(layer) for layer in decoder.model.layers):
        # The memory manager streams a layer by hooks that copy its weights in around its
        # forward: host work that a replayed graph would skip, reading stale staging buffers.
        return "some layers stream from host memory (their weights move each step)"
    if decoder.config.rope.rope_type == "dynamic":
        return "dynamic NTK RoPE decides its frequencies on the host each step"
    return None


def _runs_hooks(module: torch.nn.Module) -> bool:
    return bool(module._forward_pre_hooks or module._forward_hooks)


class HeldCache:
    """A BufferCache as a captured step sees it: the step writes the slots that the device-side
    ``position`` names, and leaves the counters to its caller (``DecoderSteps``, or an engine's
    own captured step over ``inputs_embeds``), which moves them around each replay with
    ``cache.begin`` / ``cache.advance`` (a replay cannot move a host counter, and warm-up runs
    must not move either)."""

    static = True

    def __init__(self, cache: BufferCache) -> None:
        self._cache = cache

    @property
    def length(self) -> int:
        return self._cache.length

    @property
    def offset(self) -> Tensor:
        return self._cache.offset

    @property
    def max_length(self) -> int:
        return self._cache.max_length

    @property
    def rope(self) -> object:
        return self._cache.rope

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        return self._cache.update(layer, k, v)

    def begin(self, new: int) -> None:
        pass

    def advance(self, new: int) -> None:
        pass


class DecoderSteps:
    """A CausalDecoder's decode step over a BufferCache as one CUDA graph per batch size.

    ``steps(tokens [B, 1], positions [B, 1], padding [B, max_length] or None)`` returns the step's
    float32 logits [B, V] (the first ``vocab`` of them when given) and, when ``params`` are
    graph-safe, the sampled tokens [B] (drawn in the graph from ``generator``); else None, and the
    caller samples. The cache advances one token per call. ``padding`` is the 2D attention mask
    padded with zeros to the cache length, updated in place by the caller. ``decoder`` may be
    ``compile_module(decoder, ...)``.
    """

    def __init__(
        self,
        decoder: CausalDecoder | Compiled,
        cache: BufferCache,
        *,
        params: SamplingParams | None = None,
        generator: torch.Generator | None = None,
        vocab: int | None = None,
        enabled: bool = True,
    ) -> None:
        self.cache = cache
        held = HeldCache(cache)
        in_graph = params if params is not None and graph_safe(params) else None  # sampled here
        sample = in_graph is not None
        if in_graph is not None and in_graph.do_sample and generator is None:
            raise ValueError("DecoderSteps: sampling in the graph needs the request's generator")

        def step(
            tokens: Tensor, positions: Tensor, padding: Tensor | None = None
        ) -> Tensor | tuple[Tensor, Tensor]:
            logits = decoder(
                tokens, held, positions=positions, padding_mask=padding, logits_to_keep=1
            )
            scores = logits[:, -1, :vocab].to(copy=True, dtype=torch.float32)  # [B, V]
            if in_graph is None:
                return scores
            return scores, hf_sample(scores, tokens, 1, in_graph, generator)

        why = eager_reason(decoder, cache) if enabled else None
        self.samples = sample
        self.graphs = Graphs(
            step,
            name="lm.decode",
            device=decoder.device,
            enabled=enabled and why is None,
            generator=generator if sample else None,
        )
        if why is not None:
            self.graphs.reason = f"{why}; ran eagerly"
        self._tensors = list(decoder.parameters())
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
        if isinstance(out, tuple):  # the step sampled: (scores, tokens)
            scores, tokens = out
            return scores, tokens
        return out, None


class LayerSteps:
    """Each decoder layer's decode step as its own CUDA graph, replayed in order.

    For engines that run something between layers that a graph cannot hold (layers streamed from
    host memory, host-side control): ``steps(x [B, 1, hidden], rotary, mask)`` runs every layer
    on the BufferCache and returns the hidden state; the caller advances the cache.
    """

    def __init__(self, decoder: CausalDecoder, cache: BufferCache, *, enabled: bool = True) -> None:
        config = decoder.config
        weights = [cast(DecoderLayer, layer).weights() for layer in decoder.model.layers]
        pool = torch.cuda.graph_pool_handle() if enabled and decoder.device.type == "cuda" else None

        def layer_step(index: int) -> Callable[..., Tensor]:
            def run(x: Tensor, cos: Tensor, signed_sin: Tensor, mask: Tensor) -> Tensor:
                rotary = Rotary(cos, signed_sin)
                return layer_forward(weights[index], x, rotary, mask, cache, index, config)

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
            x = cast(Tensor, layer(x, rotary.cos, rotary.signed_sin, mask))  # run() returns one
        return x
