"""WavLM's self-attention: a gated relative position bias added to the scores.

Upstream (transformers 5.24 ``WavLMAttention``) runs ``F.multi_head_attention_forward`` with
``need_weights=True``, whose arithmetic is torch's own: q scaled by ``sqrt(1 / head_dim)`` before
the product, the bias (plus -inf at padded keys) added by ``baddbmm``, softmax, ``bmm``. The
projections run on the ``[T, B, C]`` view of the input, as upstream's do, so every matmul sees the
same layout and the bits match. The bias is an additive mask, so the call goes through an
``accel.attention`` site whose reference is that arithmetic; other policies may run SDPA on it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from mizuoto_runtime.accel import Site, attention
from mizuoto_runtime.nn.wav2vec2_config import SpeechEncoderConfig
from mizuoto_runtime.ops import default

__all__ = ["SITE", "WavLMAttention"]


def _mha_reference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    mask: Tensor | None = None,
    causal: bool = False,
    scale: float | None = None,
    enable_gqa: bool = False,
    dropout_p: float = 0.0,
) -> Tensor:
    """``multi_head_attention_forward``'s need_weights path on q, k, v [B, H, T, D] (eval)."""
    if causal or enable_gqa or dropout_p:
        raise ValueError("WavLM's attention is bidirectional, without GQA or dropout")
    batch, heads, length, head_dim = q.shape
    keys = k.shape[-2]
    # [B, H, T, D] -> [B*H, T, D]: views of upstream's own [B*H, T, D] tensors, no copy
    q, k, v = (x.reshape(batch * heads, -1, head_dim) for x in (q, k, v))
    q_scaled = q * (math.sqrt(1.0 / float(head_dim)) if scale is None else scale)
    if mask is None:
        weights = torch.bmm(q_scaled, k.transpose(-2, -1))
    else:
        weights = torch.baddbmm(
            mask.reshape(batch * heads, length, keys), q_scaled, k.transpose(-2, -1)
        )
    weights = torch.softmax(weights, dim=-1)
    return torch.bmm(weights, v).view(batch, heads, length, head_dim)


SITE = Site(
    "wavlm.self_attention",
    reference=_mha_reference,
    upstream="torch.nn.functional.multi_head_attention_forward(need_weights=True), "
    "as transformers 5.24 WavLMAttention calls it",
)


class WavLMAttention(nn.Module):
    """Self-attention with WavLM's gated relative position bias; upstream's parameter names.

    The first layer holds ``rel_attn_embed`` and computes the bias [B*H, T, T]; every layer gates
    it with its own input and returns it ungated for the next.
    """

    def __init__(self, config: SpeechEncoderConfig, has_relative_position_bias: bool) -> None:
        super().__init__()
        width, heads = config.hidden_size, config.num_attention_heads
        self.num_heads, self.head_dim = heads, config.head_dim
        self.num_buckets, self.max_distance = config.num_buckets, config.max_bucket_distance
        self.k_proj = default.Linear(width, width)
        self.v_proj = default.Linear(width, width)
        self.q_proj = default.Linear(width, width)
        self.out_proj = default.Linear(width, width)
        self.gru_rel_pos_const = nn.Parameter(torch.empty(1, heads, 1, 1))
        self.gru_rel_pos_linear = default.Linear(self.head_dim, 8)
        self.rel_attn_embed = (
            default.Embedding(self.num_buckets, heads) if has_relative_position_bias else None
        )

    def forward(
        self, x: Tensor, valid: Tensor | None, position_bias: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        batch, length, width = x.shape
        heads, head_dim = self.num_heads, self.head_dim
        if position_bias is None:
            position_bias = self._relative_bias(length).unsqueeze(0).repeat(batch, 1, 1, 1)
            position_bias = position_bias.view(batch * heads, length, length)

        # the gate: two sigmoids of a projection of each head's input, summed in fours
        per_head = x.view(batch, length, heads, -1).permute(0, 2, 1, 3)  # [B, H, T, D]
        projected = self.gru_rel_pos_linear(per_head)
        projected = projected.view(batch, heads, length, 2, 4).sum(-1)
        gate_a, gate_b = torch.sigmoid(projected).chunk(2, dim=-1)
        gate = gate_a * (gate_b * self.gru_rel_pos_const - 1.0) + 2.0
        mask = (gate.view(batch * heads, -1, 1) * position_bias).view(-1, length, length)
        mask = mask.view(batch, heads, length, length)
        if valid is not None:
            padding = torch.zeros(valid.shape, dtype=x.dtype, device=x.device)
            mask = mask + padding.masked_fill_(~valid, float("-inf"))[:, None, None, :]

        seq_first = x.transpose(0, 1)  # [T, B, C], as upstream feeds torch's MHA
        q, k, v = (
            proj(seq_first).view(length, batch * heads, head_dim).transpose(0, 1)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k, v = (t.view(batch, heads, length, head_dim) for t in (q, k, v))
        scale = math.sqrt(1.0 / float(head_dim))
        out = attention(q, k, v, site=SITE, mask=mask, scale=scale)
        out = out.reshape(batch * heads, length, head_dim).transpose(0, 1)
        out = self.out_proj(out.reshape(length * batch, width)).view(length, batch, width)
        return out.transpose(0, 1), position_bias

    def _relative_bias(self, length: int) -> Tensor:
        """The learnt bias of each head for every (query, key) pair: [H, T, T]."""
        assert self.rel_attn_embed is not None  # only the first layer computes it
        positions = torch.arange(length, dtype=torch.long, device=self.rel_attn_embed.weight.device)
        relative = positions[None, :] - positions[:, None]  # key minus query
        return self.rel_attn_embed(self._bucket(relative)).permute([2, 0, 1])

    def _bucket(self, relative: Tensor) -> Tensor:
        """T5-style buckets: exact below a quarter of them, logarithmic up to max_distance."""
        half = self.num_buckets // 2
        exact = half // 2
        side = (relative > 0).to(torch.long) * half
        distance = torch.abs(relative)
        far = torch.log(distance.float() / exact)
        far = far / math.log(self.max_distance / exact)
        far = (exact + far * (half - exact)).to(torch.long)
        far = torch.min(far, torch.full_like(far, half - 1))
        return side + torch.where(distance < exact, distance, far)
