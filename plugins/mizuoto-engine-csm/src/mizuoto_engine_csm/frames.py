"""Code frames one at a time, as ``CsmGenerationMixin._sample`` writes them (transformers 5.24).

Per frame: the backbone's final-norm hidden state at the last position goes through ``lm_head``;
its fp32 logits through the main generation config's processors (temperature, then top_k, then
top_p) and softmax, then one multinomial draw: codebook 0. The depth decoder then starts from
[that hidden state, codebook 0's embedding] and writes codebooks 1..K-1, one forced step each,
with its own generation config. The frame's K code embeddings, summed, are the backbone's next
input. Every draw is ``hf_sample`` on the request's generator, so a request seeded ``s`` draws
what ``generate`` draws after ``torch.manual_seed(s)``: 1 + (K - 1) draws per frame.

The backbone's cache and CUDA graphs follow the request's ``compute.kv_cache`` and
``compute.cuda_graphs`` (steps.py); the default dynamic cache is the bitwise one.

Stops as upstream: after ``max_frames`` frames, or after a frame whose first K-1 codes are the
end code (0). The audio ends before the first frame whose K codes are all 0; ``frames`` says which
frames are audio by yielding them, and drops that one.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from mizuoto_engine_csm.config import Sampling
from mizuoto_engine_csm.model import CsmNetworks
from mizuoto_engine_csm.steps import backbone_cache
from mizuoto_runtime import SamplingParams, hf_sample
from mizuoto_sdk import RequestContext


def sampling_params(sampling: Sampling) -> SamplingParams:
    """The runtime's SamplingParams for one generation config (no EOS: CSM ignores it)."""
    return SamplingParams(
        do_sample=sampling.do_sample,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
    )


@torch.inference_mode()
def frames(
    networks: CsmNetworks,
    prompt: Tensor,
    *,
    sampling: SamplingParams,
    depth_sampling: SamplingParams,
    max_frames: int,
    ctx: RequestContext,
) -> Iterator[Tensor]:
    """The audio frames [K] (long) written after ``prompt`` [1, L, hidden] (its embeddings)."""
    backbone, parts, config = networks.backbone, networks.parts, networks.config
    device = prompt.device
    generator = ctx.generator_for(device)
    nothing = torch.zeros(1, 0, dtype=torch.long, device=device)  # no processor reads the ids
    end = config.codebook_eos_token_id
    cache, steps = backbone_cache(backbone, prompt.shape[1] + max_frames, ctx)
    x = prompt
    for index in range(max_frames):
        ctx.check_cancel()
        if steps is not None and index:  # the prefill runs eagerly, every frame after replays
            hidden = steps(x, prompt.shape[1] + index - 1)
        else:
            hidden = backbone(None, cache, inputs_embeds=x, output="hidden", logits_to_keep=1)
        logits = parts.lm_head(hidden)  # [1, 1, vocab]
        first = hf_sample(logits[:, -1, :], nothing, 0, sampling, generator)  # [1]
        frame = _depth_frame(networks, hidden[:, -1, :], first, depth_sampling, generator)
        if bool((frame == end).all()):
            return  # an all-end frame is not audio, and ends the utterance
        yield frame[0]
        if bool((frame[0, :-1] == end).all()):
            return
        x = parts.frame_embeds(frame[:, None, :])  # [1, 1, hidden]


def _depth_frame(
    networks: CsmNetworks,
    hidden: Tensor,
    first: Tensor,
    sampling: SamplingParams,
    generator: torch.Generator,
) -> Tensor:
    """The frame [1, K]: codebook 0's code ``first`` [1], then the depth decoder's K-1 codes."""
    depth, parts = networks.depth, networks.parts
    codebooks = networks.config.num_codebooks
    nothing = torch.zeros(1, 0, dtype=torch.long, device=first.device)
    cache = depth.new_cache("dynamic", max_length=codebooks)
    x = parts.depth_prefill(hidden, first)  # [1, 2, depth hidden]
    codes = [first]
    for codebook in range(1, codebooks):
        out = depth(None, cache, inputs_embeds=x, output="hidden", logits_to_keep=1)
        code = hf_sample(parts.codebook_logits(out, codebook), nothing, 0, sampling, generator)
        codes.append(code)
        if codebook < codebooks - 1:
            x = parts.depth_step(code, codebook)  # [1, 1, depth hidden]
    return torch.stack(codes, dim=1)  # [1, K]
