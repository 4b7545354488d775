"""A stand-in for SpeechBrain's ECAPA-TDNN, re-derived from its source, and a folder writer.

SpeechBrain is not installed (it is not a test extra), so the peer that
``mizuoto_runtime.nn.ecapa`` is compared with is this module: plain ``torch.nn`` modules named and
nested as ``speechbrain.lobes.models.ECAPA_TDNN`` names them (``blocks.0.conv.conv.weight``,
``blocks.1.res2net_block.blocks.0.norm.norm.running_mean``, ``asp.tdnn...``, ``fc.conv.weight``),
each forward written from upstream's: ``nnet.CNN.Conv1d`` with "same" padding computed by its
``get_padding_elem`` (from the layer's *input channel count*, as upstream passes it; at stride 1
only the kernel's reach matters) and reflected, ``nnet.normalization.BatchNorm1d``,
``dataio.length_to_mask``, the SE block's and the pooling's statistics. It is the peer, not an
implementation: it keeps upstream's module objects (ReLU, Tanh, Sigmoid, Dropout1d) and
upstream's order, whatever that costs.

It lives beside the benchmark that times against it (``benchmarks/nn_speakers.py``) because a
benchmark must not import the tests; ``tests/runtime/test_nn_ecapa.py`` loads this file by path.

``save_folder(folder, seed=..., **fields)`` writes what the Hub ships for
``speechbrain/spkrec-ecapa-voxceleb``: a ``hyperparams.yaml`` whose ``embedding_model`` entry is
tagged ``!new:`` with ``input_size: !ref <n_mels>``, beside the other entries such a file has, and
``embedding_model.ckpt``, the state dict of a randomly initialised ``EcapaReference`` (running
statistics, batch-norm weights and biases drawn too) saved with ``torch.save``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

DEFAULTS: dict[str, Any] = {
    "lin_neurons": 192,
    "channels": [512, 512, 512, 512, 1536],
    "kernel_sizes": [5, 3, 3, 3, 1],
    "dilations": [1, 2, 3, 4, 1],
    "attention_channels": 128,
    "res2net_scale": 8,
    "se_channels": 128,
    "global_context": True,
    "groups": [1, 1, 1, 1, 1],
}


def padding_elem(length_in: int, stride: int, kernel_size: int, dilation: int) -> list[int]:
    """``speechbrain.nnet.CNN.get_padding_elem``."""
    if stride > 1:
        return [math.floor(kernel_size / 2)] * 2
    length_out = math.floor((length_in - dilation * (kernel_size - 1) - 1) / stride) + 1
    return [math.floor((length_in - length_out) / 2)] * 2


def length_to_mask(length: Tensor, max_len: int, device: torch.device) -> Tensor:
    """``speechbrain.dataio.dataio.length_to_mask`` with ``max_len`` and ``device`` given."""
    mask = torch.arange(max_len, device=length.device, dtype=length.dtype).expand(
        len(length), max_len
    ) < length.unsqueeze(1)
    return torch.as_tensor(mask, dtype=length.dtype, device=device)


class SameConv1d(nn.Module):
    """``speechbrain.nnet.CNN.Conv1d`` with ``skip_transpose=True``, padding "same", reflect."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        dilation: int = 1,
        groups: int = 1,
    ) -> None:
        super().__init__()
        self.in_channels, self.kernel_size, self.dilation = in_channels, kernel_size, dilation
        self.conv = nn.Conv1d(
            in_channels, out_channels, kernel_size, dilation=dilation, groups=groups
        )

    def forward(self, x: Tensor) -> Tensor:
        padding = padding_elem(self.in_channels, 1, self.kernel_size, self.dilation)
        return self.conv(F.pad(x, padding, mode="reflect"))


class BatchNorm(nn.Module):
    """``speechbrain.nnet.normalization.BatchNorm1d`` with ``skip_transpose=True``."""

    def __init__(self, input_size: int) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(input_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x)


class TDNNBlock(nn.Module):
    def __init__(
        self, in_channels: int, out_channels: int, kernel_size: int, dilation: int, groups: int = 1
    ) -> None:
        super().__init__()
        self.conv = SameConv1d(in_channels, out_channels, kernel_size, dilation, groups)
        self.activation = nn.ReLU()
        self.norm = BatchNorm(out_channels)
        self.dropout = nn.Dropout1d(p=0.0)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.norm(self.activation(self.conv(x))))


class Res2NetBlock(nn.Module):
    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            TDNNBlock(channels // scale, channels // scale, kernel_size, dilation)
            for _ in range(scale - 1)
        )
        self.scale = scale

    def forward(self, x: Tensor) -> Tensor:
        y = []
        y_i = x
        for i, x_i in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                y_i = x_i
            elif i == 1:
                y_i = self.blocks[i - 1](x_i)
            else:
                y_i = self.blocks[i - 1](x_i + y_i)
            y.append(y_i)
        return torch.cat(y, dim=1)


class SEBlock(nn.Module):
    def __init__(self, in_channels: int, se_channels: int, out_channels: int) -> None:
        super().__init__()
        self.conv1 = SameConv1d(in_channels, se_channels, 1)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = SameConv1d(se_channels, out_channels, 1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        length = x.shape[-1]
        if lengths is not None:
            mask = length_to_mask(lengths * length, length, x.device).unsqueeze(1)
            total = mask.sum(dim=2, keepdim=True)
            s = (x * mask).sum(dim=2, keepdim=True) / total
        else:
            s = x.mean(dim=2, keepdim=True)
        return self.sigmoid(self.conv2(self.relu(self.conv1(s)))) * x


def statistics(x: Tensor, m: Tensor, eps: float = 1e-12) -> tuple[Tensor, Tensor]:
    mean = (m * x).sum(2)
    std = torch.sqrt((m * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(eps))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    def __init__(self, channels: int, attention_channels: int, global_context: bool) -> None:
        super().__init__()
        self.global_context = global_context
        width = channels * 3 if global_context else channels
        self.tdnn = TDNNBlock(width, attention_channels, 1, 1)
        self.tanh = nn.Tanh()
        self.conv = SameConv1d(attention_channels, channels, 1)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        length = x.shape[-1]
        if lengths is None:
            lengths = torch.ones(x.shape[0], device=x.device)
        mask = length_to_mask(lengths * length, length, x.device).unsqueeze(1)
        if self.global_context:
            total = mask.sum(dim=2, keepdim=True).float()
            mean, std = statistics(x, mask / total)
            mean = mean.unsqueeze(2).repeat(1, 1, length)
            std = std.unsqueeze(2).repeat(1, 1, length)
            attn = torch.cat([x, mean, std], dim=1)
        else:
            attn = x
        attn = self.conv(self.tanh(self.tdnn(attn)))
        attn = attn.masked_fill(mask == 0, float("-inf"))
        mean, std = statistics(x, F.softmax(attn, dim=2))
        return torch.cat((mean, std), dim=1).unsqueeze(2)


class SERes2NetBlock(nn.Module):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        res2net_scale: int,
        se_channels: int,
        kernel_size: int,
        dilation: int,
        groups: int,
    ) -> None:
        super().__init__()
        self.tdnn1 = TDNNBlock(in_channels, out_channels, 1, 1, groups)
        self.res2net_block = Res2NetBlock(out_channels, res2net_scale, kernel_size, dilation)
        self.tdnn2 = TDNNBlock(out_channels, out_channels, 1, 1, groups)
        self.se_block = SEBlock(out_channels, se_channels, out_channels)
        self.shortcut = (
            SameConv1d(in_channels, out_channels, 1) if in_channels != out_channels else None
        )

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        residual = self.shortcut(x) if self.shortcut else x
        x = self.tdnn2(self.res2net_block(self.tdnn1(x)))
        return self.se_block(x, lengths) + residual


class EcapaReference(nn.Module):
    """``ECAPA_TDNN(input_size, **fields)``: ``[B, T, input_size]`` -> ``[B, 1, lin_neurons]``."""

    def __init__(self, input_size: int, **fields: Any) -> None:
        super().__init__()
        f = {**DEFAULTS, **fields}
        channels, kernels, dilations, groups = (
            f["channels"],
            f["kernel_sizes"],
            f["dilations"],
            f["groups"],
        )
        self.blocks = nn.ModuleList(
            [TDNNBlock(input_size, channels[0], kernels[0], dilations[0], groups[0])]
        )
        for i in range(1, len(channels) - 1):
            self.blocks.append(
                SERes2NetBlock(
                    channels[i - 1],
                    channels[i],
                    f["res2net_scale"],
                    f["se_channels"],
                    kernels[i],
                    dilations[i],
                    groups[i],
                )
            )
        self.mfa = TDNNBlock(
            channels[-2] * (len(channels) - 2), channels[-1], kernels[-1], dilations[-1], groups[-1]
        )
        self.asp = AttentiveStatisticsPooling(
            channels[-1], f["attention_channels"], f["global_context"]
        )
        self.asp_bn = BatchNorm(channels[-1] * 2)
        self.fc = SameConv1d(channels[-1] * 2, f["lin_neurons"], 1)

    def forward(self, x: Tensor, lengths: Tensor | None = None) -> Tensor:
        x = x.transpose(1, 2)
        xl = []
        for layer in self.blocks:
            x = layer(x) if isinstance(layer, TDNNBlock) else layer(x, lengths=lengths)
            xl.append(x)
        x = self.mfa(torch.cat(xl[1:], dim=1))
        x = self.asp_bn(self.asp(x, lengths=lengths))
        return self.fc(x).transpose(1, 2)


_YAML = """\
# ############################################################################
# Model: ECAPA for speaker verification (a random checkpoint in the Hub's layout)
# ############################################################################

n_mels: {n_mels}
pretrained_path: speechbrain/spkrec-ecapa-voxceleb
out_n_neurons: 7205

compute_features: !new:speechbrain.lobes.features.Fbank
    n_mels: !ref <n_mels>

mean_var_norm: !new:speechbrain.processing.features.InputNormalization
    norm_type: sentence
    std_norm: False

embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
    input_size: !ref <n_mels>
{fields}
classifier: !new:speechbrain.lobes.models.Xvector.Classifier
    input_size: 192
    out_neurons: !ref <out_n_neurons>

modules:
    compute_features: !ref <compute_features>
    mean_var_norm: !ref <mean_var_norm>
    embedding_model: !ref <embedding_model>

label_encoder: !new:speechbrain.dataio.encoder.CategoricalEncoder

pretrainer: !new:speechbrain.utils.parameter_transfer.Pretrainer
    loadables:
        embedding_model: !ref <embedding_model>
    paths:
        embedding_model: !ref <pretrained_path>/embedding_model.ckpt
"""


def _yaml_value(value: object) -> str:
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, list):
        return "[" + ", ".join(_yaml_value(v) for v in value) + "]"
    return str(value)


def build(n_mels: int, seed: int = 0, **fields: Any) -> EcapaReference:
    """A randomly initialised reference, drawn inside ``fork_rng`` (the global generator is left
    as it was): torch.nn's initialisation, then batch-norm weights, biases and running
    statistics drawn so that every normalisation matters."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # allowed: inside fork_rng, a test or benchmark checkpoint
        model = EcapaReference(n_mels, **fields)
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.BatchNorm1d):
                    assert module.running_mean is not None and module.running_var is not None
                    assert module.num_batches_tracked is not None
                    module.weight.uniform_(0.5, 1.5)
                    module.bias.normal_(0.0, 0.1)
                    module.running_mean.normal_(0.0, 0.1)
                    module.running_var.uniform_(0.5, 2.0)
                    module.num_batches_tracked.fill_(seed + 1)
    return model.eval()


def save_folder(folder: Path, n_mels: int = 24, seed: int = 0, **fields: Any) -> EcapaReference:
    """Write ``hyperparams.yaml`` and ``embedding_model.ckpt`` to ``folder``; return the model."""
    model = build(n_mels, seed, **fields)
    folder.mkdir(parents=True, exist_ok=True)
    lines = "".join(f"    {k}: {_yaml_value(v)}\n" for k, v in fields.items())
    (folder / "hyperparams.yaml").write_text(_YAML.format(n_mels=n_mels, fields=lines))
    torch.save(model.state_dict(), folder / "embedding_model.ckpt")
    return model
