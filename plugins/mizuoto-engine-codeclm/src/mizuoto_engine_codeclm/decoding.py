"""Code frames one at a time from the QwenDecoder: ``lm.generate``'s loop, streamed.

``lm.generate`` returns once every token is picked; speech has to start playing long before, so
this loop yields each frame as it is sampled. Otherwise it does what ``generate`` does: a prefill,
then one forward per frame on a DynamicCache (or a BufferCache with ``compute.kv_cache =
static``), each frame drawn by ``hf_sample`` on the request's generator, decode steps replayed as
CUDA graphs when ``compute.cuda_graphs`` asks and the device and cache allow. Only the first
``audio_vocab`` logits are candidates (every code, then the end-of-audio id), so the decoder can
never answer with text. The caller checks nothing: ``ctx.check_cancel()`` runs before every step.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch
from torch import Tensor

from mizuoto_runtime import (
    BufferCache,
    Compiled,
    DecoderSteps,
    QwenDecoder,
    SamplingParams,
    hf_sample,
)
from mizuoto_sdk import RequestContext

KV_CACHE = "compute.kv_cache"
GRAPHS = "compute.cuda_graphs"
GRAPH_NAME = "codeclm.decode"


def _graph_steps(decoder: QwenDecoder, cache: object, ctx: RequestContext) -> DecoderSteps | None:
    """Captured decode steps when the request asks for CUDA graphs and they can run, else None
    with the reason in ``ctx.applied["cuda_graphs"]`` and a warning."""
    if not ctx.settings.get(GRAPHS, False):
        return None
    if decoder.device.type != "cuda":
        why = f"CUDA graphs need a CUDA device; ran eagerly on {decoder.device.type}"
    elif getattr(decoder, "unit_gate", None) is not None:
        why = "some decoder layers stream from host memory (their weights move); ran eagerly"
    elif not isinstance(cache, BufferCache):
        why = "CUDA graphs need compute.kv_cache=static (a fixed-address cache); ran eagerly"
    else:
        return DecoderSteps(decoder, cache)
    ctx.applied.setdefault("cuda_graphs", {})[GRAPH_NAME] = f"eager: {why}"
    ctx.warn(f"{GRAPHS}: {why}")
    return None


def frames(
    decoder: QwenDecoder,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    audio_vocab: int,
    end: int,
    max_frames: int,
    ctx: RequestContext,
    compiled: Compiled | None = None,
) -> Iterator[int]:
    """The codes the decoder writes after ``prompt``, until ``end`` or ``max_frames`` of them.

    ``compiled`` is ``compile_module(decoder, ...)`` when ``compute.compile`` is on: it runs the
    prefill and eager steps (it gathers weights and RoPE itself, so none are passed to it).
    """
    device = decoder.device
    generator = ctx.generator_for(device)
    ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)  # [1, T]
    length = ids.shape[1]
    kind = str(ctx.settings.get(KV_CACHE, "dynamic"))
    cache = decoder.new_cache(kind, batch=1, max_length=length + max_frames - 1)
    ctx.applied["kv_cache"] = kind
    steps = _graph_steps(decoder, cache, ctx)
    model = decoder if compiled is None else compiled
    eager = compiled is None
    weights = decoder.weights() if eager else None
    table = decoder.rotary_table(length + max_frames) if eager else None

    def forward(tokens: Tensor, start: int) -> Tensor:  # -> next-frame scores [1, audio_vocab]
        rotary = None if table is None else table.at(start, tokens.shape[1])
        logits = model(tokens, cache, logits_to_keep=1, weights=weights, rotary=rotary)
        return logits[:, -1, :audio_vocab]

    scores = forward(ids, 0)
    for step in range(max_frames):
        ctx.check_cancel()
        token = hf_sample(scores, ids, length, params, generator)  # [1]
        code = int(token)
        if code == end:
            return
        yield code
        if step == max_frames - 1:
            return
        ids = torch.cat([ids, token[:, None]], dim=-1)
        if steps is None:
            scores = forward(token[:, None], length + step)
        else:
            position = torch.full((1, 1), length + step, dtype=torch.long, device=device)
            scores = steps(token[:, None], position)[0][:, :audio_vocab]
