"""Code frames one at a time from the QwenDecoder: ``lm.decode``'s steps, cut at the end code.

The decode loop is the runtime's (``mizuoto_runtime.decode``): a prefill, then one forward per
frame, each frame drawn by ``hf_sample`` on the request's generator, the cache and CUDA graphs as
the request's ``compute`` settings ask, ``ctx.check_cancel()`` before every step. This module only
says which ids are codes: the first ``audio_vocab`` logits are the candidates (every code, then
the end-of-audio id), so the decoder can never answer with text, and the end id stops the frames.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import torch

from mizuoto_runtime import Compiled, QwenDecoder, SamplingParams, decode
from mizuoto_sdk import RequestContext


def frames(
    decoder: QwenDecoder | Compiled,
    prompt: Sequence[int],
    params: SamplingParams,
    *,
    audio_vocab: int,
    end: int,
    max_frames: int,
    ctx: RequestContext,
) -> Iterator[int]:
    """The codes the decoder writes after ``prompt``, until ``end`` or ``max_frames`` of them.

    ``decoder`` may be ``compile_module(decoder, ...)`` (``compute.compile``).
    """
    ids = torch.tensor([list(prompt)], dtype=torch.long)  # [1, T]
    steps = decode(decoder, ids, params, max_new_tokens=max_frames, vocab=audio_vocab, ctx=ctx)
    for step in steps:
        code = int(step.tokens)
        if code == end:
            return
        yield code
