"""Autoregressive decoding with ``generate``'s semantics and none of its per-step machinery.

One prefill, then one forward per token; tokens are picked by ``sampling.hf_sample`` on the
request's generator, finished rows get the pad id, and the loop stops at ``max_new_tokens`` or when
every row has produced an EOS id, all as transformers 5.24 ``_sample`` does, so a request seeded
``s`` yields upstream's tokens after ``torch.manual_seed(s)``. Left-padded batches take generate's
2D attention mask (``padding_mask``), positions counted from it as upstream counts them.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from mizuoto_runtime.accel.compile import Compiled
from mizuoto_runtime.context import RequestContext, current_context
from mizuoto_runtime.lm.cache import BufferCache, DynamicCache
from mizuoto_runtime.lm.decoder import QwenDecoder
from mizuoto_runtime.lm.steps import DecoderSteps
from mizuoto_runtime.sampling import SamplingParams, hf_sample, leading_padding

__all__ = ["Generation", "generate"]

Cache = DynamicCache | BufferCache
GREEDY = SamplingParams()
KV_CACHE = "compute.kv_cache"
GRAPHS = "compute.cuda_graphs"


@attrs.frozen(eq=False)
class Generation:
    """``tokens`` [B, T + N]: prompt and new ids; ``logits`` [N, B, V] float32 raw step logits
    (only when asked for), as ``generate(output_logits=True)`` returns them."""

    tokens: Tensor
    logits: Tensor | None
    prompt_length: int

    @property
    def new_tokens(self) -> Tensor:
        return self.tokens[:, self.prompt_length :]


def _cache_for(
    decoder: QwenDecoder, kind: str | Cache | None, ctx: RequestContext | None, rows: int, size: int
) -> Cache:
    if isinstance(kind, (DynamicCache, BufferCache)):
        return kind
    if kind is None:
        kind = "dynamic" if ctx is None else str(ctx.settings.get(KV_CACHE, "dynamic"))
    # upstream sizes a static cache max_length - 1: the last token is never fed back
    cache = decoder.new_cache(kind, batch=rows, max_length=size)
    if ctx is not None:
        ctx.applied["kv_cache"] = kind
    return cache


def _decode_steps(
    decoder: QwenDecoder,
    kv: Cache,
    params: SamplingParams,
    generator: torch.Generator | None,
    ctx: RequestContext | None,
):
    """The captured decode step when the request asks for CUDA graphs and they can run."""
    if ctx is None or not ctx.settings.get(GRAPHS, False):
        return None

    module = decoder.module if isinstance(decoder, Compiled) else decoder
    if getattr(module, "unit_gate", None) is not None:
        # A captured graph would keep reading the staging buffers it saw at capture time.
        why = "some layers stream from host memory (their weights move each step); ran eagerly"
        ctx.applied.setdefault("cuda_graphs", {})["lm.decode"] = f"eager: {why}"
        ctx.warn(f"{GRAPHS}: {why}")
        return None
    if not isinstance(kv, BufferCache):
        why = "they need compute.kv_cache=static (a fixed-address cache); ran eagerly"
        ctx.applied.setdefault("cuda_graphs", {})["lm.decode"] = f"eager: {why}"
        if decoder.device.type == "cuda":
            ctx.warn(f"{GRAPHS}: {why}")
        return None
    return DecoderSteps(decoder, kv, params=params, generator=generator)


def generate(
    decoder: QwenDecoder | Compiled,
    input_ids: Tensor,
    params: SamplingParams = GREEDY,
    *,
    max_new_tokens: int,
    generator: torch.Generator | None = None,
    cache: str | Cache | None = None,
    padding_mask: Tensor | None = None,
    pad_token_id: int | None = None,
    output_logits: bool = False,
) -> Generation:
    """Decode up to ``max_new_tokens`` tokens after ``input_ids`` [B, T].

    ``decoder`` may be ``compile_module(decoder, ...)``. ``generator`` defaults to the bound
    request's ``generator_for(device)``; ``cache`` is ``"dynamic"``, ``"static"`` (a
    BufferCache sized like upstream's StaticCache), a cache object,
    or None for the request's ``compute.kv_cache``. ``pad_token_id`` defaults to the first EOS id,
    as upstream's does. With ``compute.cuda_graphs`` on and a static cache, decode steps replay as
    CUDA graphs (``graphs.DecoderSteps``). Runs under ``torch.inference_mode``.
    """
    ctx = current_context()
    device = decoder.device
    input_ids = input_ids.to(device)
    rows, prompt_length = input_ids.shape
    if generator is None and params.do_sample:
        if ctx is None:
            raise ValueError("generate: sampling needs generator= (or a bound RequestContext)")
        generator = ctx.generator_for(device)
    if padding_mask is not None:
        padding_mask = padding_mask.to(device)
        penalty_padding = leading_padding(padding_mask)
        if bool((padding_mask == 1).all()):  # upstream drops an all-ones mask
            padding_mask = None
    else:
        penalty_padding = None
    eos = torch.tensor(params.eos_token_id, dtype=torch.long, device=device)
    pad = params.eos_token_id[0] if pad_token_id is None and params.eos_token_id else pad_token_id
    if params.eos_token_id and pad is None:
        raise ValueError("generate: an EOS id needs a pad_token_id for finished rows")
    kv = _cache_for(decoder, cache, ctx, rows, prompt_length + max_new_tokens - 1)

    steps = _decode_steps(decoder, kv, params, generator, ctx)
    if padding_mask is None:
        positions = torch.arange(prompt_length, device=device)[None].repeat(rows, 1)  # [B, T]
    else:
        positions = padding_mask.long().cumsum(-1) - 1
        positions = positions.masked_fill(padding_mask == 0, 0)
    ids = input_ids
    unfinished = torch.ones(rows, dtype=torch.long, device=device)
    step_logits: list[Tensor] = []
    # Gathered weights and a RoPE table save eager steps their lookups; a compiled forward
    # reads the parameters itself and fuses RoPE, so it is given neither.
    compiled = isinstance(decoder, Compiled) and decoder.fallback is None
    weights = None if compiled else decoder.weights()
    table = None if compiled else decoder.rotary_table(prompt_length + max_new_tokens)

    def rope_rows(start: int, length: int, where: Tensor):
        if table is None:
            return None
        return table.at(start, length) if padding_mask is None else table.gather(where)

    with torch.inference_mode():
        logits = decoder(
            input_ids,
            kv,
            positions=positions,
            padding_mask=padding_mask,
            logits_to_keep=1,
            weights=weights,
            rotary=rope_rows(0, prompt_length, positions),
        )
        scores = logits[:, -1].to(copy=True, dtype=torch.float32)  # [B, V]
        sampled: Tensor | None = None
        if steps is not None and padding_mask is not None:  # graphs need a fixed-size mask
            padding_mask = torch.nn.functional.pad(padding_mask, (0, kv.max_length - prompt_length))
        for step in range(max_new_tokens):
            if output_logits:
                step_logits.append(scores)
            if sampled is None:
                sampled = hf_sample(
                    scores, ids, prompt_length, params, generator, padding=penalty_padding
                )  # [B]
            tokens, sampled = sampled, None
            if params.eos_token_id:
                tokens = tokens * unfinished + pad * (1 - unfinished)
                unfinished = unfinished & ~torch.isin(tokens, eos)
            ids = torch.cat([ids, tokens[:, None]], dim=-1)
            if step == max_new_tokens - 1 or (params.eos_token_id and not bool(unfinished.any())):
                break
            if ctx is not None:
                ctx.check_cancel()
            positions = positions[:, -1:] + 1  # [B, 1]
            if steps is not None:
                if padding_mask is not None:
                    padding_mask[:, kv.length] = 1
                scores, sampled = steps(tokens[:, None], positions, padding_mask)
                continue
            if padding_mask is not None:
                padding_mask = torch.cat([padding_mask, padding_mask.new_ones((rows, 1))], dim=-1)
            logits = decoder(
                tokens[:, None],
                kv,
                positions=positions,
                padding_mask=padding_mask,
                logits_to_keep=1,
                weights=weights,
                rotary=rope_rows(prompt_length + step, 1, positions),
            )
            scores = logits[:, -1].to(copy=True, dtype=torch.float32)
    stacked = torch.stack(step_logits) if output_logits else None
    return Generation(tokens=ids, logits=stacked, prompt_length=prompt_length)
