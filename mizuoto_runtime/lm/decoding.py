"""The decode loop: a prefill, then one forward per token, each token yielded as it is picked.

``generate`` collects it; a streaming engine takes each token as it comes (speech starts playing
long before the last frame is written). Tokens are picked by ``sampling.hf_sample`` on the
request's generator, finished rows get the pad id, and the loop stops at ``max_new_tokens`` or when
every row has produced an EOS id, all as transformers 5.24 ``_sample`` does, so a request seeded
``s`` yields upstream's tokens after ``torch.manual_seed(s)``. Left-padded batches take generate's
2D attention mask (``padding_mask``), positions counted from it as upstream counts them.

The request's ``compute.kv_cache`` picks the cache and ``compute.cuda_graphs`` replays the decode
steps as CUDA graphs (``steps.DecoderSteps``) where they can run; what ran is written to
``ctx.applied``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import torch
from torch import Tensor

from mizuoto_runtime.accel.compile import Compiled
from mizuoto_runtime.context import RequestContext, current_context
from mizuoto_runtime.lm.cache import BufferCache, DynamicCache
from mizuoto_runtime.lm.decoder import CausalDecoder
from mizuoto_runtime.lm.steps import DecoderSteps, eager_reason
from mizuoto_runtime.sampling import SamplingParams, hf_sample, leading_padding

__all__ = ["GREEDY", "Step", "decode"]

Cache = DynamicCache | BufferCache
GREEDY = SamplingParams()


class Step(NamedTuple):
    """One decode step: ``tokens`` [B] picked (the pad id in finished rows) from ``logits``
    [B, V] float32, the step's raw logits (as ``generate(output_logits=True)`` returns them)."""

    tokens: Tensor
    logits: Tensor


def decode(
    decoder: CausalDecoder | Compiled,
    input_ids: Tensor,
    params: SamplingParams = GREEDY,
    *,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
    cache: str | Cache | None = None,
    padding_mask: Tensor | None = None,
    pad_token_id: int | None = None,
    vocab: int | None = None,
    ctx: RequestContext | None = None,
) -> Iterator[Step]:
    """The steps after ``input_ids`` [B, T]: up to ``max_new_tokens``, fewer when every row ends.

    ``ctx`` is the request (default: the bound one). ``decoder`` may be
    ``compile_module(decoder, ...)``. ``generator`` defaults to ``ctx.generator_for(device)``;
    ``cache`` is ``"dynamic"``, ``"static"`` (a BufferCache sized like upstream's StaticCache), a
    cache object, or None for the request's ``compute.kv_cache``. ``pad_token_id`` defaults to
    the first EOS id, as upstream's does. ``vocab``: only ids below it are candidates (the logits
    are cut to them before sampling), for a decoder whose vocabulary holds ids an engine must
    never write. ``ctx.check_cancel()`` runs before each step's forward. Nothing runs until the
    first ``next()``, and closing the iterator stops the loop.
    """
    ctx = current_context() if ctx is None else ctx
    device = decoder.device
    input_ids = input_ids.to(device)
    rows, prompt_length = input_ids.shape
    if generator is None and params.do_sample:
        if ctx is None:
            raise ValueError("decode: sampling needs generator= (or a RequestContext)")
        generator = ctx.generator_for(device)
    penalty_padding = None
    if padding_mask is not None:
        padding_mask = padding_mask.to(device)
        penalty_padding = leading_padding(padding_mask)
        if bool((padding_mask == 1).all()):  # upstream drops an all-ones mask
            padding_mask = None
    eos = torch.tensor(params.eos_token_id, dtype=torch.long, device=device)
    pad = params.eos_token_id[0] if pad_token_id is None and params.eos_token_id else pad_token_id
    if params.eos_token_id and pad is None:
        raise ValueError("decode: an EOS id needs a pad_token_id for finished rows")
    # upstream sizes a static cache max_length - 1: the last token is never fed back
    kv = _cache_for(decoder, cache, ctx, rows, prompt_length + max_new_tokens - 1)
    steps = _graph_steps(decoder, kv, params, generator, vocab, ctx)

    @torch.inference_mode()
    def forward(tokens: Tensor, positions: Tensor | None, padding: Tensor | None) -> Tensor:
        logits = decoder(tokens, kv, positions=positions, padding_mask=padding, logits_to_keep=1)
        return logits[:, -1, :vocab].to(copy=True, dtype=torch.float32)  # [B, V]

    # Positions by default follow the cache (its RoPE table holds their rows); a padded batch
    # counts them from the mask, and a captured step reads them from the device.
    positions = None
    if padding_mask is not None:
        positions = padding_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(padding_mask == 0, 0)  # [B, T]
    elif steps is not None:
        positions = torch.arange(prompt_length, device=device)[None].repeat(rows, 1)  # [B, T]
    ids = input_ids
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    scores = forward(input_ids, positions, padding_mask)
    sampled: Tensor | None = None
    if steps is not None and padding_mask is not None:  # graphs need a fixed-size mask
        padding_mask = torch.nn.functional.pad(
            padding_mask, (0, steps.cache.max_length - prompt_length)
        )
    for step in range(max_new_tokens):
        with torch.inference_mode():
            if sampled is None:
                sampled = hf_sample(
                    scores, ids, prompt_length, params, generator, padding=penalty_padding
                )  # [B]
            tokens, sampled = sampled, None
            if params.eos_token_id and pad is not None:  # pad is set whenever an EOS id is
                tokens = tokens * unfinished + pad * (1 - unfinished)
                unfinished = unfinished & ~torch.isin(tokens, eos)
            ids = torch.cat([ids, tokens[:, None]], dim=-1)
        yield Step(tokens, scores)
        if step == max_new_tokens - 1 or (params.eos_token_id and not bool(unfinished.any())):
            return
        if ctx is not None:
            ctx.check_cancel()
        if positions is not None:
            positions = positions[:, -1:] + 1  # [B, 1]
        if steps is not None:
            if padding_mask is not None:
                padding_mask[:, kv.length] = 1
            with torch.inference_mode():
                scores, sampled = steps(tokens[:, None], positions, padding_mask)  # type: ignore[arg-type]  # positions are a tensor whenever steps are
            continue
        if padding_mask is not None:
            padding_mask = torch.cat([padding_mask, padding_mask.new_ones((rows, 1))], dim=-1)
        scores = forward(tokens[:, None], positions, padding_mask)


def _cache_for(
    decoder: CausalDecoder | Compiled,
    kind: str | Cache | None,
    ctx: RequestContext | None,
    rows: int,
    size: int,
) -> Cache:
    if isinstance(kind, (DynamicCache, BufferCache)):
        return kind
    if kind is None:
        kind = "dynamic" if ctx is None else ctx.compute.kv_cache
    cache = decoder.new_cache(kind, batch=rows, max_length=size)
    if ctx is not None:
        ctx.applied["kv_cache"] = kind
    return cache


def _graph_steps(
    decoder: CausalDecoder | Compiled,
    cache: Cache,
    params: SamplingParams,
    generator: torch.Generator | None,
    vocab: int | None,
    ctx: RequestContext | None,
) -> DecoderSteps | None:
    """Captured decode steps when the request asks for CUDA graphs and they can run.

    What the request could change (its cache) or should know (streamed layers) is a warning; a
    device without CUDA is only noted in ``applied`` by the steps themselves, which run eagerly.
    """
    if ctx is None or not ctx.compute.cuda_graphs:
        return None
    why = eager_reason(decoder, cache)
    if why is not None:
        ctx.applied.setdefault("cuda_graphs", {})["lm.decode"] = f"eager: {why}; ran eagerly"
        ctx.warn(f"compute.cuda_graphs: {why}; ran eagerly")
        return None
    assert isinstance(cache, BufferCache)  # eager_reason said so
    return DecoderSteps(decoder, cache, params=params, generator=generator, vocab=vocab)
