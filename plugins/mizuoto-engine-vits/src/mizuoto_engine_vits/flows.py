"""The prior's normalising flow, run in reverse: prior latents -> spectrogram-space latents.

Affine coupling layers (Kim et al., "Conditional Variational Autoencoder with Adversarial
Learning for End-to-End Text-to-Speech", 2021, §2.1.3) whose shift comes from a WaveNet of
gated dilated convolutions, with a channel flip between layers; VITS fixes the scale to one
(mean-only), so the inverse is a subtraction. Parameter names are transformers'
``VitsResidualCouplingBlock``'s. Upstream keeps the WaveNet convolutions under weight
normalisation and recomputes each weight on every call; ``fold_weight_norm`` computes them once
at load with the same op (``torch._weight_norm``), so the weights, and the audio, are the same
bits.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor, nn

from mizuoto_engine_vits.config import VitsConfig
from mizuoto_runtime.ops import default
from mizuoto_sdk.errors import EngineUnavailable

_NORMED = {
    ".parametrizations.weight.original0": ".parametrizations.weight.original1",
    ".weight_g": ".weight_v",
}
"""Weight-norm magnitude suffix -> direction suffix: transformers 5's parametrizations, and the
older ``weight_norm`` names that the Hub's MMS-TTS checkpoints carry."""


def fold_weight_norm(state_dict: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``state_dict`` with every weight-norm pair replaced by the ``.weight`` it stands for."""
    folded: dict[str, Tensor] = {}
    pairs: dict[str, tuple[str, str]] = {}
    for name in state_dict:
        for magnitude, direction in _NORMED.items():
            for suffix in (magnitude, direction):
                if name.endswith(suffix):
                    base = name[: -len(suffix)]
                    pairs[base] = (base + magnitude, base + direction)
    for name, tensor in state_dict.items():
        if not any(name in pair for pair in pairs.values()):
            folded[name] = tensor
    for base, (magnitude, direction) in pairs.items():
        missing = [n for n in (magnitude, direction) if n not in state_dict]
        if missing:
            raise EngineUnavailable(
                f"checkpoint: {missing[0]} is missing; a weight-normalised layer needs both "
                f"{magnitude} and {direction}"
            )
        g, v = state_dict[magnitude], state_dict[direction]
        folded[base + ".weight"] = torch._weight_norm(v, g, 0)
    return folded


class VitsWaveNet(nn.Module):
    """Gated dilated convolutions with residual and skip outputs, optionally speaker-conditioned."""

    def __init__(self, config: VitsConfig, num_layers: int, **factory: Any) -> None:
        super().__init__()
        hidden = self.hidden_size = config.hidden_size
        if config.speaker_embedding_size != 0:
            size = config.speaker_embedding_size
            self.cond_layer = default.Conv1d(size, 2 * hidden * num_layers, 1, **factory)
        self.in_layers = nn.ModuleList()
        self.res_skip_layers = nn.ModuleList()
        k = config.wavenet_kernel_size
        for i in range(num_layers):
            dilation = config.wavenet_dilation_rate**i
            self.in_layers.append(
                default.Conv1d(
                    hidden,
                    2 * hidden,
                    k,
                    dilation=dilation,
                    padding=(k * dilation - dilation) // 2,
                    **factory,
                )
            )
            out = 2 * hidden if i < num_layers - 1 else hidden  # the last layer has no residual
            self.res_skip_layers.append(default.Conv1d(hidden, out, 1, **factory))

    def forward(self, x: Tensor, mask: Tensor, speaker: Tensor | None) -> Tensor:
        hidden = self.hidden_size
        skip = torch.zeros_like(x)
        cond = None if speaker is None else self.cond_layer(speaker)
        last = len(self.in_layers) - 1
        for i, (conv, res_skip) in enumerate(
            zip(self.in_layers, self.res_skip_layers, strict=True)
        ):
            h = conv(x)
            if cond is not None:  # upstream adds zeros when unconditioned: the same values
                h = h + cond[:, i * 2 * hidden : (i + 1) * 2 * hidden, :]
            acts = torch.tanh(h[:, :hidden, :]) * torch.sigmoid(h[:, hidden:, :])
            out = res_skip(acts)
            if i < last:
                x = (x + out[:, :hidden, :]) * mask
                skip = skip + out[:, hidden:, :]
            else:
                skip = skip + out
        return skip * mask


class VitsResidualCouplingLayer(nn.Module):
    """One mean-only affine coupling: the second half shifted by a function of the first."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.half_channels = half = config.flow_size // 2
        self.conv_pre = default.Conv1d(half, config.hidden_size, 1, **factory)
        self.wavenet = VitsWaveNet(config, config.prior_encoder_num_wavenet_layers, **factory)
        self.conv_post = default.Conv1d(config.hidden_size, half, 1, **factory)

    def forward(self, x: Tensor, mask: Tensor, speaker: Tensor | None) -> Tensor:
        """The inverse coupling (the direction inference runs)."""
        first, second = torch.split(x, [self.half_channels] * 2, dim=1)
        h = self.wavenet(self.conv_pre(first) * mask, mask, speaker)
        mean = self.conv_post(h) * mask
        # Upstream multiplies by exp(-log_stddev) with log_stddev zero: by one, exactly.
        return torch.cat([first, (second - mean) * mask], dim=1)


class VitsResidualCouplingBlock(nn.Module):
    """The prior flow: ``prior_encoder_num_flows`` coupling layers, a channel flip after each."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.flows = nn.ModuleList(
            VitsResidualCouplingLayer(config, **factory)
            for _ in range(config.prior_encoder_num_flows)
        )

    def forward(self, x: Tensor, mask: Tensor, speaker: Tensor | None) -> Tensor:
        """The inverse flow: latents ``[B, flow, frames]`` -> spectrogram-space latents."""
        for flow in reversed(self.flows):
            x = flow(torch.flip(x, [1]), mask, speaker)
        return x
