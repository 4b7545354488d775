"""``generate``: the decode loop (``lm.decode``) collected, as transformers' ``generate`` does.

A request seeded ``s`` yields upstream's tokens after ``torch.manual_seed(s)``; see ``lm.decode``
for the loop itself (sampling, EOS and padding, the cache and CUDA graphs it picks).
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from mizuoto_runtime.accel.compile import Compiled
from mizuoto_runtime.lm.decoder import CausalDecoder
from mizuoto_runtime.lm.decoding import GREEDY, Cache, decode
from mizuoto_runtime.sampling import SamplingParams

__all__ = ["Generation", "generate"]


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


def generate(
    decoder: CausalDecoder | Compiled,
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
    """Decode up to ``max_new_tokens`` tokens after ``input_ids`` [B, T] and return them all.

    The arguments are ``decode``'s (``compile_module(decoder, ...)`` too; ``cache=None`` takes
    the request's ``compute.kv_cache``; with ``compute.cuda_graphs`` on and a static cache, decode
    steps replay as CUDA graphs). ``output_logits`` keeps each step's float32 logits.
    """
    tokens, logits = [], []
    for step in decode(
        decoder,
        input_ids,
        params,
        max_new_tokens=max_new_tokens,
        generator=generator,
        cache=cache,
        padding_mask=padding_mask,
        pad_token_id=pad_token_id,
    ):
        tokens.append(step.tokens)
        if output_logits:
            logits.append(step.logits)
    prompt = input_ids.to(decoder.device)
    with torch.inference_mode():
        ids = torch.cat([prompt, torch.stack(tokens, dim=1)], dim=-1) if tokens else prompt
    stacked = torch.stack(logits) if output_logits else None
    return Generation(tokens=ids, logits=stacked, prompt_length=prompt.shape[1])
