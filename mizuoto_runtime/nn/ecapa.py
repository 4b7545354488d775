"""ECAPA-TDNN as SpeechBrain ships it: fbank features in, a speaker embedding out.

The speaker encoder of Desplanques et al., "ECAPA-TDNN: Emphasized Channel Attention, Propagation
and Aggregation in TDNN Based Speaker Verification" (2020), in the form of SpeechBrain's
``speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN`` (the ``embedding_model`` of
``speechbrain/spkrec-ecapa-voxceleb`` and of the voice-cloning models that reuse it): a TDNN
layer, SE-Res2Net layers, multi-layer feature aggregation, attentive statistics pooling with
global context, a batch norm and a 1x1 conv. Module and parameter names are upstream's, so
``embedding_model.ckpt`` loads as it is, and the operations are upstream's in upstream's order,
so float32 on the CPU equals it bit for bit:

- every conv pads "same" as SpeechBrain's ``Conv1d`` does, by reflection, ``dilation * (kernel -
  1) // 2`` samples each side (its ``get_padding_elem`` at stride 1), then convolves unpadded;
- a TDNN block is conv, ReLU, batch norm (eval: running statistics), in that order;
- the relative ``lengths`` become upstream's mask, ``arange(T) < lengths * T`` in float32, used
  for the squeeze-excitation means and the pooling's statistics and attention as upstream uses
  it; without ``lengths`` the squeeze-excitation takes the plain mean, as upstream does.

Masks and the pooling's statistics stay float32 whatever the weights' dtype (upstream computes
them in its float32 lengths' dtype too; in bfloat16 its forward then fails on the dtype mismatch):
in float32 the casts are no-ops, in bfloat16 they keep the reductions over time accurate.
"""

from __future__ import annotations

from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.nn.ecapa_config import EcapaConfig, read_hyperparams
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into
from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["EcapaConfig", "EcapaTdnn", "SpeakerEncoder", "build", "load", "read_hyperparams"]

_EPS = 1e-12  # the pooling's variance floor, upstream's


class Conv1d(nn.Module):
    """SpeechBrain's ``Conv1d`` on ``[B, C, T]``: reflect-pad "same", then ``self.conv``."""

    def __init__(
        self,
        inputs: int,
        outputs: int,
        kernel: int = 1,
        dilation: int = 1,
        groups: int = 1,
        **factory: Any,
    ) -> None:
        super().__init__()
        self.padding = dilation * (kernel - 1) // 2
        self.conv = default.Conv1d(
            inputs, outputs, kernel, dilation=dilation, groups=groups, **factory
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(F.pad(x, (self.padding, self.padding), mode="reflect"))


class _StatelessBatchNorm1d(nn.BatchNorm1d):
    """torch.nn's ``BatchNorm1d`` (ones and zeros at construction: nothing drawn) without the step
    counter ``num_batches_tracked``, which only counts training steps; a checkpoint's is skipped
    when loading."""

    def __init__(self, channels: int, **factory: Any) -> None:
        super().__init__(channels, **factory)
        self.register_buffer("num_batches_tracked", None)

    def reset_running_stats(self) -> None:
        assert self.running_mean is not None and self.running_var is not None
        self.running_mean.zero_()
        self.running_var.fill_(1)


class BatchNorm1d(nn.Module):
    """SpeechBrain's ``BatchNorm1d`` wrapper: ``self.norm``, used in eval mode (running
    statistics)."""

    def __init__(self, channels: int, **factory: Any) -> None:
        super().__init__()
        self.norm = _StatelessBatchNorm1d(channels, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(x)


class TDNNBlock(nn.Module):
    """Conv, ReLU, batch norm."""

    def __init__(
        self,
        inputs: int,
        outputs: int,
        kernel: int,
        dilation: int,
        groups: int = 1,
        **factory: Any,
    ) -> None:
        super().__init__()
        self.conv = Conv1d(inputs, outputs, kernel, dilation, groups, **factory)
        self.norm = BatchNorm1d(outputs, **factory)

    def forward(self, x: Tensor) -> Tensor:
        return self.norm(torch.relu(self.conv(x)))


class Res2NetBlock(nn.Module):
    """``scale`` channel slices; the first passes, each later one is a TDNN of itself plus the
    previous slice's output."""

    def __init__(self, channels: int, scale: int, kernel: int, dilation: int, **factory: Any):
        super().__init__()
        width = channels // scale
        self.scale = scale
        self.blocks = nn.ModuleList(
            TDNNBlock(width, width, kernel, dilation, **factory) for _ in range(scale - 1)
        )

    def forward(self, x: Tensor) -> Tensor:
        outputs: list[Tensor] = []
        for i, part in enumerate(torch.chunk(x, self.scale, dim=1)):
            if i == 0:
                y = part
            elif i == 1:
                y = self.blocks[0](part)
            else:
                y = self.blocks[i - 1](part + y)
            outputs.append(y)
        return torch.cat(outputs, dim=1)


class SEBlock(nn.Module):
    """Squeeze-and-excitation: the (masked) mean over time gates each channel."""

    def __init__(self, channels: int, se_channels: int, **factory: Any) -> None:
        super().__init__()
        self.conv1 = Conv1d(channels, se_channels, **factory)
        self.conv2 = Conv1d(se_channels, channels, **factory)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        if mask is None:
            s = x.mean(dim=2, keepdim=True)
        else:
            s = ((x * mask).sum(dim=2, keepdim=True) / mask.sum(dim=2, keepdim=True)).to(x.dtype)
        s = torch.sigmoid(self.conv2(torch.relu(self.conv1(s))))  # [B, C, 1]
        return s * x


class SERes2NetBlock(nn.Module):
    """TDNN, Res2Net, TDNN, squeeze-excitation, plus the input (through a 1x1 conv when the
    channel count changes)."""

    def __init__(self, config: EcapaConfig, layer: int, **factory: Any) -> None:
        super().__init__()
        inputs, outputs = config.channels[layer - 1], config.channels[layer]
        groups = config.groups[layer]
        self.tdnn1 = TDNNBlock(inputs, outputs, 1, 1, groups, **factory)
        self.res2net_block = Res2NetBlock(
            outputs,
            config.res2net_scale,
            config.kernel_sizes[layer],
            config.dilations[layer],
            **factory,
        )
        self.tdnn2 = TDNNBlock(outputs, outputs, 1, 1, groups, **factory)
        self.se_block = SEBlock(outputs, config.se_channels, **factory)
        self.shortcut = Conv1d(inputs, outputs, **factory) if inputs != outputs else None

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        residual = x if self.shortcut is None else self.shortcut(x)
        x = self.res2net_block(self.tdnn1(x))
        return self.se_block(self.tdnn2(x), mask) + residual


def _statistics(x: Tensor, weights: Tensor) -> tuple[Tensor, Tensor]:
    """Weighted mean and standard deviation over time, as upstream's ``_compute_statistics``."""
    mean = (weights * x).sum(2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(2).clamp(_EPS))
    return mean, std


class AttentiveStatisticsPooling(nn.Module):
    """Attention over time per channel (seeing the utterance's mean and deviation under global
    context), then the attended mean and deviation: ``[B, C, T] -> [B, 2C, 1]``."""

    def __init__(self, config: EcapaConfig, **factory: Any) -> None:
        super().__init__()
        channels = config.channels[-1]
        self.global_context = config.global_context
        inputs = channels * 3 if config.global_context else channels
        self.tdnn = TDNNBlock(inputs, config.attention_channels, 1, 1, **factory)
        self.conv = Conv1d(config.attention_channels, channels, **factory)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        frames = x.shape[-1]
        if self.global_context:
            mean, std = _statistics(x, mask / mask.sum(dim=2, keepdim=True))
            mean = mean.to(x.dtype).unsqueeze(2).repeat(1, 1, frames)
            std = std.to(x.dtype).unsqueeze(2).repeat(1, 1, frames)
            attn = torch.cat([x, mean, std], dim=1)  # [B, 3C, T]
        else:
            attn = x
        attn = self.conv(torch.tanh(self.tdnn(attn)))
        attn = attn.float().masked_fill(mask == 0, float("-inf"))
        mean, std = _statistics(x, F.softmax(attn, dim=2))
        return torch.cat((mean, std), dim=1).unsqueeze(2).to(x.dtype)


class EcapaTdnn(nn.Module):
    """The network: features ``[B, T, input_size]`` -> embedding ``[B, 1, lin_neurons]``."""

    def __init__(self, config: EcapaConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        c = config.channels
        first = TDNNBlock(
            config.input_size,
            c[0],
            config.kernel_sizes[0],
            config.dilations[0],
            config.groups[0],
            **factory,
        )
        self.blocks = nn.ModuleList(
            [first, *(SERes2NetBlock(config, i, **factory) for i in range(1, len(c) - 1))]
        )
        self.mfa = TDNNBlock(
            c[-2] * (len(c) - 2),
            c[-1],
            config.kernel_sizes[-1],
            config.dilations[-1],
            config.groups[-1],
            **factory,
        )
        self.asp = AttentiveStatisticsPooling(config, **factory)
        self.asp_bn = BatchNorm1d(c[-1] * 2, **factory)
        self.fc = Conv1d(c[-1] * 2, config.lin_neurons, **factory)

    def forward(self, features: Tensor, lengths: Tensor | None = None) -> Tensor:
        """``lengths``: None, or float32 relative lengths ``[B]`` on the features' device."""
        x = self.blocks[0](features.transpose(1, 2))  # [B, C0, T]
        mask = None if lengths is None else _mask(lengths, x.shape[-1])
        aggregated = []
        for block in self.blocks[1:]:
            x = block(x, mask)
            aggregated.append(x)
        x = self.mfa(torch.cat(aggregated, dim=1))  # [B, C_last, T]
        # The pooling always masks: without lengths, upstream's lengths are ones.
        if lengths is None:
            lengths = torch.ones(x.shape[0], device=x.device, dtype=torch.float32)
        x = self.fc(self.asp_bn(self.asp(x, _mask(lengths, x.shape[-1]))))  # [B, lin, 1]
        return x.transpose(1, 2)

    def min_frames(self) -> int:
        """The shortest input every reflect padding fits (padding < length, torch's rule)."""
        config = self.config
        pads = config.paddings()
        # An odd reach (even kernel) shortens by one frame: the first layer's and the
        # aggregation's are the only ones upstream lets through.
        shrink = [
            d * (k - 1) - 2 * p
            for k, d, p in zip(config.kernel_sizes, config.dilations, pads, strict=True)
        ]
        later = max(pads[1:]) if config.res2net_scale > 1 else pads[-1]
        return max(pads[0] + 1, later + 1 + shrink[0], 1 + shrink[0] + shrink[-1])


def _mask(lengths: Tensor, frames: int) -> Tensor:
    """Upstream's ``length_to_mask(lengths * T, max_len=T)`` as ``[B, 1, T]``, float32."""
    absolute = lengths * frames
    mask = torch.arange(frames, device=lengths.device, dtype=lengths.dtype).expand(
        len(lengths), frames
    ) < absolute.unsqueeze(1)
    return mask.to(lengths.dtype).unsqueeze(1)


class SpeakerEncoder:
    """A loaded ECAPA-TDNN: ``encoder(features, lengths)`` is upstream's
    ``embedding_model(features, lengths)``.

    ``features`` is ``[B, T, input_size]`` (SpeechBrain's normalised fbank), moved to the
    encoder's device and dtype; ``lengths`` is None or each utterance's relative length in
    ``(0, 1]`` (SpeechBrain's ``wav_lens``). The embedding is ``[B, 1, lin_neurons]``. Calls hold
    no state, so threads may share one encoder. ``handles`` lets a memory manager place the
    weights.
    """

    def __init__(self, module: EcapaTdnn, handles: tuple[ModelHandle, ...]) -> None:
        self.module = module
        self.config = module.config
        self.handles = handles
        self.min_frames = module.min_frames()

    @property
    def device(self) -> torch.device:
        return self.module.fc.conv.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.module.fc.conv.weight.dtype

    def __call__(self, features: Tensor, lengths: Tensor | Sequence[float] | None = None) -> Tensor:
        size = self.config.input_size
        if not isinstance(features, Tensor) or not features.is_floating_point():
            raise ValueError(f"features: expected a floating-point tensor, got {_what(features)}")
        if features.dim() != 3 or features.shape[-1] != size:
            raise ValueError(
                f"features: expected [batch, frames, {size}], got {list(features.shape)}"
            )
        if features.shape[1] < self.min_frames or features.shape[0] < 1:
            raise ValueError(
                f"features: expected at least one utterance of at least {self.min_frames} "
                f"frames (the reflect padding of this config), got {list(features.shape)}"
            )
        features = features.to(device=self.device, dtype=self.dtype)
        relative = None if lengths is None else self._lengths(lengths, features.shape[0])
        with torch.inference_mode():
            return self.module(features, relative)

    def _lengths(self, lengths: object, batch: int) -> Tensor:
        if isinstance(lengths, Tensor) and not lengths.is_floating_point():
            raise ValueError(f"lengths: expected relative lengths (floats), got {_what(lengths)}")
        try:
            relative = torch.as_tensor(lengths, dtype=torch.float32, device=self.device)
        except (TypeError, ValueError, RuntimeError) as error:
            raise ValueError(f"lengths: expected {batch} relative lengths, got {error}") from None
        if relative.shape != (batch,):
            raise ValueError(
                f"lengths: expected shape [{batch}] (one per utterance), got {list(relative.shape)}"
            )
        if not bool(((relative > 0) & (relative <= 1)).all()):
            raise ValueError(
                f"lengths: expected relative lengths in (0, 1], got {relative.tolist()}"
            )
        return relative


def _what(value: object) -> str:
    if isinstance(value, Tensor):
        return f"a {str(value.dtype).removeprefix('torch.')} tensor"
    return f"a {type(value).__name__}"


def build(
    entry: dict[str, Any],
    state_dict: dict[str, Tensor],
    *,
    device: str,
    dtype: torch.dtype,
    name: str = "ecapa_tdnn",
) -> SpeakerEncoder:
    """The encoder of an ``embedding_model`` entry (``ECAPA_TDNN``'s keyword arguments), its
    weights loaded strictly from ``state_dict``; its handle is named ``NAME:embedding_model``."""
    config = EcapaConfig.from_dict(entry)
    with torch.device("meta"):
        module = EcapaTdnn(config, dtype=dtype)
    load_into(module, state_dict, cast=True, ignore=("*.num_batches_tracked",))
    module.to(device).eval()
    handle = ModelHandle(
        module,
        name=f"{name}:embedding_model",
        load_device=device,
        units=[*module.blocks, module.mfa, module.asp],
    )
    return SpeakerEncoder(module, (handle,))


def load(
    folder: str | PathLike[str],
    *,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    name: str | None = None,
) -> SpeakerEncoder:
    """The ECAPA-TDNN of a SpeechBrain folder: ``hyperparams.yaml`` (its ``embedding_model``
    entry) and ``embedding_model.ckpt``. ``dtype`` defaults to float32; ``name`` prefixes the
    handle's name (default ``ecapa_tdnn@FOLDER``)."""
    entry = read_hyperparams(folder)
    EcapaConfig.from_dict(entry)  # a bad config is refused before the weights are read
    path = Path(folder) / "embedding_model.ckpt"
    try:
        state_dict = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise EngineUnavailable(f"{folder}: no embedding_model.ckpt") from None
    except Exception as error:  # torch raises several types for a file it cannot unpickle
        raise EngineUnavailable(f"{path}: not a readable torch state dict: {error}") from error
    if not isinstance(state_dict, dict) or not all(
        isinstance(v, Tensor) for v in state_dict.values()
    ):
        raise EngineUnavailable(f"{path}: expected a state dict (names to tensors)")
    return build(
        entry,
        state_dict,
        device=device,
        dtype=torch.float32 if dtype is None else dtype,
        name=name or f"ecapa_tdnn@{Path(folder).resolve()}",
    )
