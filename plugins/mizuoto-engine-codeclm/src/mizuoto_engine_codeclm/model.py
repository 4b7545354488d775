"""The codec-LM's networks: a Qwen3 decoder that writes code frames, a codec that plays them.

The decoder is ``mizuoto_runtime.lm.QwenDecoder`` as it is. The codec turns one code per frame
into ``hop`` samples at 24 kHz: an embedding per code, a causal convolution, and upsampling blocks
(a transposed convolution, then a residual causal convolution) whose strides multiply to ``hop``.
Everything is causal, so a frame's samples depend on it and the ``context`` frames before it only:
that is what lets audio stream while the decoder is still writing.

Both load from one safetensors file (``decoder.*``, ``codec.*``) with ``load_into``, strictly, and
are cast there to the dtype the host chose; the file itself holds float32.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TypedDict

import attrs
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_engine_codeclm.tokenizer import TokenConfig
from mizuoto_runtime import Compiled, QwenConfig, QwenDecoder, load_into, load_state_dict, ops
from mizuoto_runtime.lm.tensor_parallel import TensorParallelGroups, shard_state_dict

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
SLOPE = 0.1  # leaky ReLU


def _ints(value: object) -> tuple[int, ...]:
    return tuple(value)  # type: ignore[arg-type]


@attrs.frozen(kw_only=True)
class CodecConfig:
    sample_rate: int
    codebook: int
    channels: int
    strides: tuple[int, ...] = attrs.field(converter=_ints)
    widths: tuple[int, ...] = attrs.field(converter=_ints)
    kernel: int
    block_frames: int

    @property
    def hop(self) -> int:
        """Samples per code frame."""
        return math.prod(self.strides)


@attrs.frozen(kw_only=True)
class GenerationConfig:
    frames_per_byte: int
    extra_frames: int
    min_frames: int

    def frame_bound(self, text_bytes: int) -> int:
        """The most frames a text of ``text_bytes`` bytes may take, unless the caller says."""
        return self.frames_per_byte * text_bytes + self.extra_frames


@attrs.frozen(kw_only=True)
class InitConfig:
    seed: int
    embedding_scale: float
    output_gain: float


@attrs.frozen(kw_only=True)
class ModelConfig:
    """config.json: the vocabulary, both networks, the length rule, and how weights were made."""

    tokens: TokenConfig
    decoder: QwenConfig
    codec: CodecConfig
    generation: GenerationConfig
    init: InitConfig

    @classmethod
    def from_file(cls, path: str | Path) -> ModelConfig:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
        config = cls(
            tokens=TokenConfig.from_dict(raw["tokens"]),
            decoder=QwenConfig.from_dict(raw["decoder"]),
            codec=CodecConfig(**raw["codec"]),
            generation=GenerationConfig(**raw["generation"]),
            init=InitConfig(**raw["init"]),
        )
        vocab = config.tokens.vocab_size
        if config.decoder.vocab_size != vocab or config.codec.codebook != config.tokens.codebook:
            raise ValueError(
                f"{path}: decoder.vocab_size must be {vocab} and codec.codebook "
                f"{config.tokens.codebook}, as the tokens section implies"
            )
        return config


class _Placement(TypedDict):
    dtype: torch.dtype
    device: torch.device | str | None


class CausalConv1d(ops.default.Conv1d):
    """A Conv1d that sees the present and the past only: ``kernel - 1`` zeros on the left."""

    def forward(self, x: Tensor) -> Tensor:
        return super().forward(F.pad(x, (self.kernel_size[0] - 1, 0)))


class CausalUpsample(ops.default.ConvTranspose1d):
    """``stride``x upsampling with a ``2 * stride`` kernel; the tail that waits on the next
    frame is cut, so output sample j depends on input steps j // stride and the one before."""

    def __init__(
        self,
        width_in: int,
        width_out: int,
        stride: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(width_in, width_out, 2 * stride, stride=stride, dtype=dtype, device=device)

    def forward(self, x: Tensor) -> Tensor:  # type: ignore[override]  # no output_size: the cut sets the length
        return super().forward(x)[..., : x.shape[-1] * self.stride[0]]


class UpBlock(nn.Module):
    def __init__(
        self,
        width_in: int,
        width_out: int,
        stride: int,
        kernel: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        self.up = CausalUpsample(width_in, width_out, stride, **kw)
        self.conv = CausalConv1d(width_out, width_out, kernel, **kw)

    def forward(self, x: Tensor) -> Tensor:
        x = self.up(F.leaky_relu(x, SLOPE))  # [B, out, T * stride]
        return x + self.conv(F.leaky_relu(x, SLOPE))


class Codec(nn.Module):
    """Code frames [B, W] (-1: no frame, a zero embedding) -> samples [B, W * hop] in [-1, 1]."""

    def __init__(
        self, config: CodecConfig, *, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.config = config
        kw: _Placement = {"dtype": dtype, "device": device}
        self.embed = ops.default.Embedding(config.codebook, config.channels, **kw)
        self.pre = CausalConv1d(config.channels, config.channels, 3, **kw)
        widths = (config.channels, *config.widths)
        self.blocks = nn.ModuleList(
            UpBlock(widths[i], widths[i + 1], stride, config.kernel, **kw)
            for i, stride in enumerate(config.strides)
        )
        self.post = CausalConv1d(widths[-1], 1, config.kernel, **kw)

    @property
    def context(self) -> int:
        """Frames before a frame that its samples depend on (the receptive field, rounded up)."""
        config, rate = self.config, 1
        past = 2.0  # the pre convolution's kernel of 3
        for stride in config.strides:
            past += 1 / rate  # the upsampler reads the previous step too
            rate *= stride
            past += (config.kernel - 1) / rate
        return math.ceil(past + (config.kernel - 1) / rate)  # and the post convolution

    def forward(self, codes: Tensor) -> Tensor:
        present = (codes >= 0).unsqueeze(-1)  # [B, W, 1]
        x = self.embed(codes.clamp(min=0)) * present.to(self.embed.weight.dtype)  # [B, W, C]
        x = self.pre(x.transpose(1, 2))  # [B, C, W]
        for block in self.blocks:
            x = block(x)  # [B, width, W * strides so far]
        return torch.tanh(self.post(F.leaky_relu(x, SLOPE)))[:, 0]  # [B, W * hop]

    def decode(self, codes: Tensor) -> Tensor:
        """All of ``codes`` [n] at once -> [n * hop]: bitwise what any streaming of them gives."""
        return CodecStream.of(self).push(codes)


class CodecStream:
    """Decodes frames as they arrive; the concatenated output never depends on the chunking.

    Convolution kernels pick their algorithm by input length, so the same frame decoded in a
    longer or shorter input differs in the last bits. Here every frame is decoded in a window of
    one shape at a fixed place: block ``j`` covers frames [j*B, (j+1)*B) and is decoded from
    frames [j*B - context, (j+1)*B), with frames not yet known (or before the start) as -1.
    Causality makes the unknown future irrelevant, so a block decoded early for its first frames
    gives the same bits for them as the whole block decoded later. ``codec`` is the Codec or its
    compiled form.
    """

    def __init__(self, codec: Codec | Compiled, *, context: int, block: int, hop: int) -> None:
        self.codec, self.context, self.block, self.hop = codec, context, block, hop
        self._codes: Tensor | None = None

    @classmethod
    def of(cls, codec: Codec, module: Codec | Compiled | None = None) -> CodecStream:
        """A stream over ``codec``'s windows; ``module`` runs them (its compiled form, say)."""
        config = codec.config
        module = codec if module is None else module
        return cls(module, context=codec.context, block=config.block_frames, hop=config.hop)

    def push(self, codes: Tensor) -> Tensor:
        """The samples of ``codes`` [k], the frames after those pushed before -> [k * hop]."""
        held = codes if self._codes is None else torch.cat([self._codes, codes])
        start, end = held.shape[0] - codes.shape[0], held.shape[0]
        self._codes = held
        width, pieces = self.context + self.block, []
        for block in range(start // self.block, -(-end // self.block)):
            first = block * self.block - self.context  # the frame at window position 0
            window = torch.full((1, width), -1, dtype=torch.long, device=held.device)
            lo, hi = max(first, 0), min(first + width, end)
            window[0, lo - first : hi - first] = held[lo:hi]
            audio = self.codec(window)[0]  # [width * hop]
            keep_lo, keep_hi = max(start, block * self.block), min(end, (block + 1) * self.block)
            pieces.append(audio[(keep_lo - first) * self.hop : (keep_hi - first) * self.hop])
        if not pieces:
            return torch.zeros(0, dtype=torch.float32, device=held.device)
        return torch.cat(pieces)


class CodecLM(nn.Module):
    """The checkpoint's layout: ``decoder.*`` is a QwenDecoder, ``codec.*`` the Codec.

    With ``parallel`` groups of several ranks the decoder is split (attention and dense TP);
    the codec is whole on every rank.
    """

    def __init__(
        self,
        config: ModelConfig,
        *,
        dtype: torch.dtype,
        device: torch.device | str | None = None,
        parallel: TensorParallelGroups | None = None,
    ) -> None:
        super().__init__()
        self.decoder = QwenDecoder(config.decoder, dtype=dtype, device=device, parallel=parallel)
        self.codec = Codec(config.codec, dtype=dtype, device=device)


def load_model(
    model_dir: str | Path,
    *,
    dtype: torch.dtype,
    device: torch.device | str,
    parallel: TensorParallelGroups | None = None,
) -> tuple[ModelConfig, QwenDecoder, Codec]:
    """config.json and model.safetensors from ``model_dir``, strictly, cast to ``dtype``.

    A missing, unexpected, mis-shaped key is a ``LoadError`` naming it: a weights file that does
    not match its config is a broken install, never something to load halfway. With
    ``parallel``, each rank takes its slice of the same full file.
    """
    model_dir = Path(model_dir)
    config = ModelConfig.from_file(model_dir / CONFIG_FILE)
    # Built where it runs: ops.default layers allocate without drawing, and a few MB of empty
    # tensors cost less than building on "meta" (whose RoPE table goes through torch's refs).
    model = CodecLM(config, dtype=dtype, device=device, parallel=parallel)
    state = load_state_dict(model_dir / WEIGHTS_FILE, device=device)
    load_into(model, shard_state_dict(model, state), cast=True)
    return config, model.decoder.eval(), model.codec.eval()
