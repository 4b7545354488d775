"""Re-derived references of two upstream vocoders with no transformers class: BigVGAN
(NVIDIA/BigVGAN v2.4: ``bigvgan.py``, ``activations.py``, ``alias_free_activation/torch``) and
Vocos (gemelo-ai/vocos 0.1.0: ``models.py``, ``heads.py``, ``spectral_ops.py``,
``feature_extractors.py``).

Plain ``torch.nn`` modules with upstream's structure, parameter names, initial buffers and forward,
written from its code's facts (not copied), and savers that write a folder as the Hub ships each
one: BigVGAN's ``config.json`` (hyperparameters, no ``model_type``) with ``bigvgan_generator.pt``
(``{"generator": state_dict}``) or ``model.safetensors``; Vocos' ``config.yaml`` (class paths and
``init_args``) with ``pytorch_model.bin``. Weight norm is torch's old hook
(``torch.nn.utils.weight_norm``), as upstream uses, so checkpoints hold ``weight_g`` / ``weight_v``.

One copy serves ``benchmarks/nn_vocoders.py`` and ``tests/runtime/test_nn_bigvgan.py`` /
``test_nn_vocos.py`` (which load this file by its path), so the benchmark's ``same`` column checks
against the very oracle the tests do. torchaudio is not needed: the mel feature extractor keeps
its submodule names (``mel_spec.spectrogram.window``, ``mel_spec.mel_scale.fb``) and does
torchaudio's ``spectrogram(power=1)`` and ``MelScale`` steps.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# -- BigVGAN -----------------------------------------------------------------------------------


def kaiser_sinc_filter1d(cutoff: float, half_width: float, kernel_size: int) -> Tensor:
    """The Kaiser-windowed sinc low-pass of ``alias_free_activation/torch/filter.py``,
    ``[1, 1, kernel_size]``, normalised to sum 1."""
    even = kernel_size % 2 == 0
    half = kernel_size // 2
    attenuation = 2.285 * (half - 1) * math.pi * (4 * half_width) + 7.95
    if attenuation > 50.0:
        beta = 0.1102 * (attenuation - 8.7)
    elif attenuation >= 21.0:
        beta = 0.5842 * (attenuation - 21) ** 0.4 + 0.07886 * (attenuation - 21.0)
    else:
        beta = 0.0
    window = torch.kaiser_window(kernel_size, beta=beta, periodic=False)
    time = torch.arange(-half, half) + 0.5 if even else torch.arange(kernel_size) - half
    taps = 2 * cutoff * window * torch.sinc(2 * cutoff * time)
    taps /= taps.sum()
    return taps.view(1, 1, kernel_size)


class Snake(nn.Module):
    def __init__(self, channels: int, logscale: bool, beta: bool) -> None:
        super().__init__()
        self.logscale = logscale
        self.alpha = nn.Parameter(torch.zeros(channels) if logscale else torch.ones(channels))
        if beta:
            self.beta = nn.Parameter(torch.zeros(channels) if logscale else torch.ones(channels))
        self.has_beta = beta

    def forward(self, x: Tensor) -> Tensor:
        alpha = self.alpha.unsqueeze(0).unsqueeze(-1)
        if self.has_beta:
            beta = self.beta.unsqueeze(0).unsqueeze(-1)
            if self.logscale:
                alpha, beta = torch.exp(alpha), torch.exp(beta)
            return x + (1.0 / (beta + 0.000000001)) * torch.pow(torch.sin(x * alpha), 2)
        if self.logscale:
            alpha = torch.exp(alpha)
        return x + (1.0 / (alpha + 0.000000001)) * torch.pow(torch.sin(x * alpha), 2)


class UpSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12) -> None:
        super().__init__()
        self.ratio, self.stride = ratio, ratio
        self.pad = kernel_size // ratio - 1
        self.pad_left = self.pad * ratio + (kernel_size - ratio) // 2
        self.pad_right = self.pad * ratio + (kernel_size - ratio + 1) // 2
        self.register_buffer("filter", kaiser_sinc_filter1d(0.5 / ratio, 0.6 / ratio, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad, self.pad), mode="replicate")
        x = self.ratio * F.conv_transpose1d(
            x, self.filter.expand(channels, -1, -1), stride=self.stride, groups=channels
        )
        return x[..., self.pad_left : -self.pad_right]


class LowPassFilter1d(nn.Module):
    def __init__(self, cutoff: float, half_width: float, stride: int, kernel_size: int) -> None:
        super().__init__()
        even = kernel_size % 2 == 0
        self.pad_left, self.pad_right = kernel_size // 2 - int(even), kernel_size // 2
        self.stride = stride
        self.register_buffer("filter", kaiser_sinc_filter1d(cutoff, half_width, kernel_size))

    def forward(self, x: Tensor) -> Tensor:
        channels = x.shape[1]
        x = F.pad(x, (self.pad_left, self.pad_right), mode="replicate")
        weight = self.filter.expand(channels, -1, -1)
        return F.conv1d(x, weight, stride=self.stride, groups=channels)


class DownSample1d(nn.Module):
    def __init__(self, ratio: int = 2, kernel_size: int = 12) -> None:
        super().__init__()
        self.lowpass = LowPassFilter1d(0.5 / ratio, 0.6 / ratio, ratio, kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        return self.lowpass(x)


class Activation1d(nn.Module):
    def __init__(self, activation: nn.Module) -> None:
        super().__init__()
        self.act = activation
        self.upsample = UpSample1d()
        self.downsample = DownSample1d()

    def forward(self, x: Tensor) -> Tensor:
        return self.downsample(self.act(self.upsample(x)))


def _weight_norm(module: nn.Module) -> nn.Module:
    with warnings.catch_warnings():  # upstream still uses the deprecated hook; so do we
        warnings.simplefilter("ignore", FutureWarning)
        return nn.utils.weight_norm(module)


def _conv(channels: int, kernel: int, dilation: int) -> nn.Module:
    padding = int((kernel * dilation - dilation) / 2)
    return _weight_norm(
        nn.Conv1d(channels, channels, kernel, 1, dilation=dilation, padding=padding)
    )


def _snake(h: dict[str, Any], channels: int) -> Snake:
    return Snake(channels, h["snake_logscale"], h["activation"] == "snakebeta")


class AMPBlock1(nn.Module):
    def __init__(self, h: dict[str, Any], channels: int, kernel: int, dilation: list[int]) -> None:
        super().__init__()
        self.convs1 = nn.ModuleList(_conv(channels, kernel, d) for d in dilation)
        self.convs2 = nn.ModuleList(_conv(channels, kernel, 1) for _ in dilation)
        count = 2 * len(dilation)
        self.activations = nn.ModuleList(Activation1d(_snake(h, channels)) for _ in range(count))

    def forward(self, x: Tensor) -> Tensor:
        acts1, acts2 = self.activations[::2], self.activations[1::2]
        for c1, c2, a1, a2 in zip(self.convs1, self.convs2, acts1, acts2, strict=False):
            xt = a1(x)
            xt = c1(xt)
            xt = a2(xt)
            xt = c2(xt)
            x = xt + x
        return x


class AMPBlock2(nn.Module):
    def __init__(self, h: dict[str, Any], channels: int, kernel: int, dilation: list[int]) -> None:
        super().__init__()
        self.convs = nn.ModuleList(_conv(channels, kernel, d) for d in dilation)
        self.activations = nn.ModuleList(Activation1d(_snake(h, channels)) for _ in dilation)

    def forward(self, x: Tensor) -> Tensor:
        for c, a in zip(self.convs, self.activations, strict=False):
            xt = a(x)
            xt = c(xt)
            x = xt + x
        return x


class BigVGAN(nn.Module):
    def __init__(self, h: dict[str, Any]) -> None:
        super().__init__()
        self.h = h
        self.num_kernels = len(h["resblock_kernel_sizes"])
        self.num_upsamples = len(h["upsample_rates"])
        width = h["upsample_initial_channel"]
        self.conv_pre = _weight_norm(nn.Conv1d(h["num_mels"], width, 7, 1, padding=3))
        block = AMPBlock1 if h["resblock"] == "1" else AMPBlock2
        self.ups = nn.ModuleList()
        pairs = zip(h["upsample_rates"], h["upsample_kernel_sizes"], strict=False)  # as upstream
        for i, (u, k) in enumerate(pairs):
            up = nn.ConvTranspose1d(
                width // 2**i, width // 2 ** (i + 1), k, u, padding=(k - u) // 2
            )
            self.ups.append(nn.ModuleList([_weight_norm(up)]))
        self.resblocks = nn.ModuleList()
        for i in range(len(self.ups)):
            ch = width // 2 ** (i + 1)
            kernels = zip(h["resblock_kernel_sizes"], h["resblock_dilation_sizes"], strict=False)
            for k, d in kernels:
                self.resblocks.append(block(h, ch, k, d))
        self.activation_post = Activation1d(_snake(h, ch))
        self.use_bias_at_final = h.get("use_bias_at_final", True)
        self.conv_post = _weight_norm(
            nn.Conv1d(ch, 1, 7, 1, padding=3, bias=self.use_bias_at_final)
        )
        self.use_tanh_at_final = h.get("use_tanh_at_final", True)

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv_pre(x)
        for i in range(self.num_upsamples):
            for i_up in range(len(self.ups[i])):
                x = self.ups[i][i_up](x)
            xs = None
            for j in range(self.num_kernels):
                if xs is None:
                    xs = self.resblocks[i * self.num_kernels + j](x)
                else:
                    xs += self.resblocks[i * self.num_kernels + j](x)
            x = xs / self.num_kernels
        x = self.activation_post(x)
        x = self.conv_post(x)
        if self.use_tanh_at_final:
            return torch.tanh(x)
        return torch.clamp(x, min=-1.0, max=1.0)


def bigvgan_config(**overrides: Any) -> dict[str, Any]:
    """A tiny BigVGAN ``config.json`` (training keys as the Hub's carry some) with overrides."""
    h: dict[str, Any] = {
        "resblock": "1",
        "num_gpus": 0,
        "upsample_rates": [4, 2],
        "upsample_kernel_sizes": [8, 4],
        "upsample_initial_channel": 16,
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 3]],
        "activation": "snakebeta",
        "snake_logscale": True,
        "num_mels": 10,
        "n_fft": 64,
        "hop_size": 8,
        "sampling_rate": 8000,
        "fmax": None,
    }
    h.update(overrides)
    return h


def make_bigvgan(h: dict[str, Any], seed: int = 0) -> BigVGAN:
    """A BigVGAN with torch's default initialisation and random snake parameters (upstream's are
    constant at first), drawn from ``seed`` without touching the caller's generator state."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # allowed: a reference, inside fork_rng
        model = BigVGAN(h).eval()
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, Snake):
                    for p in module.parameters():
                        p.copy_(0.3 * torch.randn_like(p) + (0.0 if module.logscale else 1.0))
    return model


def save_bigvgan(model: BigVGAN, folder: Path, *, safetensors: bool = False) -> Path:
    """``config.json`` and ``bigvgan_generator.pt`` (or ``model.safetensors``), as the Hub has."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(model.h, indent=4))
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if safetensors:
        from safetensors.torch import save_file

        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save({"generator": state}, folder / "bigvgan_generator.pt")
    return folder


# -- Vocos -------------------------------------------------------------------------------------


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int, intermediate_dim: int, layer_scale_init_value: float) -> None:
        super().__init__()
        self.dwconv = nn.Conv1d(dim, dim, kernel_size=7, padding=3, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, intermediate_dim)
        self.act = nn.GELU()
        self.pwconv2 = nn.Linear(intermediate_dim, dim)
        scale = layer_scale_init_value
        self.gamma = nn.Parameter(scale * torch.ones(dim)) if scale > 0 else None

    def forward(self, x: Tensor) -> Tensor:
        residual = x
        x = self.dwconv(x)
        x = x.transpose(1, 2)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = self.act(x)
        x = self.pwconv2(x)
        if self.gamma is not None:
            x = self.gamma * x
        x = x.transpose(1, 2)
        return residual + x


class VocosBackbone(nn.Module):
    def __init__(
        self,
        input_channels: int,
        dim: int,
        intermediate_dim: int,
        num_layers: int,
        layer_scale_init_value: float | None = None,
    ) -> None:
        super().__init__()
        self.embed = nn.Conv1d(input_channels, dim, kernel_size=7, padding=3)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        scale = layer_scale_init_value or 1 / num_layers
        self.convnext = nn.ModuleList(
            ConvNeXtBlock(dim, intermediate_dim, scale) for _ in range(num_layers)
        )
        self.final_layer_norm = nn.LayerNorm(dim, eps=1e-6)

    def forward(self, x: Tensor) -> Tensor:
        x = self.embed(x)
        x = self.norm(x.transpose(1, 2))
        x = x.transpose(1, 2)
        for block in self.convnext:
            x = block(x)
        return self.final_layer_norm(x.transpose(1, 2))


class ISTFT(nn.Module):
    def __init__(self, n_fft: int, hop_length: int, win_length: int, padding: str) -> None:
        super().__init__()
        self.padding, self.n_fft, self.hop_length, self.win_length = (
            padding,
            n_fft,
            hop_length,
            win_length,
        )
        self.register_buffer("window", torch.hann_window(win_length))

    def forward(self, spec: Tensor) -> Tensor:
        if self.padding == "center":
            return torch.istft(
                spec, self.n_fft, self.hop_length, self.win_length, self.window, center=True
            )
        pad = (self.win_length - self.hop_length) // 2
        _, _, frames = spec.shape
        ifft = torch.fft.irfft(spec, self.n_fft, dim=1, norm="backward")
        ifft = ifft * self.window[None, :, None]
        output_size = (frames - 1) * self.hop_length + self.win_length
        fold = {
            "output_size": (1, output_size),
            "kernel_size": (1, self.win_length),
            "stride": (1, self.hop_length),
        }
        y = F.fold(ifft, **fold)[:, 0, 0, pad:-pad]
        window_sq = self.window.square().expand(1, frames, -1).transpose(1, 2)
        envelope = F.fold(window_sq, **fold).squeeze()[pad:-pad]
        assert (envelope > 1e-11).all()
        return y / envelope


class ISTFTHead(nn.Module):
    def __init__(self, dim: int, n_fft: int, hop_length: int, padding: str = "same") -> None:
        super().__init__()
        self.out = nn.Linear(dim, n_fft + 2)
        self.istft = ISTFT(n_fft, hop_length, n_fft, padding)

    def forward(self, x: Tensor) -> Tensor:
        x = self.out(x).transpose(1, 2)
        mag, p = x.chunk(2, dim=1)
        mag = torch.exp(mag)
        mag = torch.clip(mag, max=1e2)
        x = torch.cos(p)
        y = torch.sin(p)
        S = mag * (x + 1j * y)
        return self.istft(S)


def melscale_fbanks(n_freqs: int, n_mels: int, sample_rate: int) -> Tensor:
    """torchaudio's ``melscale_fbanks`` for its defaults (HTK scale, no norm, 0 to Nyquist)."""
    all_freqs = torch.linspace(0, sample_rate // 2, n_freqs)
    m_max = 2595.0 * math.log10(1.0 + (float(sample_rate // 2) / 700.0))
    m_pts = torch.linspace(0.0, m_max, n_mels + 2)
    f_pts = 700.0 * (10.0 ** (m_pts / 2595.0) - 1.0)
    f_diff = f_pts[1:] - f_pts[:-1]
    slopes = f_pts.unsqueeze(0) - all_freqs.unsqueeze(1)
    down = (-1.0 * slopes[:, :-2]) / f_diff[:-1]
    up = slopes[:, 2:] / f_diff[1:]
    return torch.max(torch.zeros(1), torch.min(down, up))


class _Spectrogram(nn.Module):
    def __init__(self, n_fft: int) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(n_fft))


class _MelScale(nn.Module):
    def __init__(self, n_fft: int, n_mels: int, sample_rate: int) -> None:
        super().__init__()
        self.register_buffer("fb", melscale_fbanks(n_fft // 2 + 1, n_mels, sample_rate))


class _MelSpectrogram(nn.Module):
    """torchaudio's ``MelSpectrogram(power=1)``: its two submodules, its forward's steps."""

    def __init__(self, sample_rate: int, n_fft: int, hop_length: int, n_mels: int, center: bool):
        super().__init__()
        self.n_fft, self.win_length, self.hop_length, self.center = n_fft, n_fft, hop_length, center
        self.spectrogram = _Spectrogram(n_fft)
        self.mel_scale = _MelScale(n_fft, n_mels, sample_rate)

    def forward(self, waveform: Tensor) -> Tensor:
        shape = waveform.size()
        waveform = waveform.reshape(-1, shape[-1])
        spec_f = torch.stft(
            input=waveform,
            n_fft=self.n_fft,
            hop_length=self.hop_length,
            win_length=self.win_length,
            window=self.spectrogram.window,
            center=self.center,
            pad_mode="reflect",
            normalized=False,
            onesided=True,
            return_complex=True,
        )
        spec_f = spec_f.reshape(shape[:-1] + spec_f.shape[-2:])
        specgram = spec_f.abs()
        return torch.matmul(specgram.transpose(-1, -2), self.mel_scale.fb).transpose(-1, -2)


class MelSpectrogramFeatures(nn.Module):
    def __init__(
        self,
        sample_rate: int = 24000,
        n_fft: int = 1024,
        hop_length: int = 256,
        n_mels: int = 100,
        padding: str = "center",
    ) -> None:
        super().__init__()
        self.padding = padding
        self.mel_spec = _MelSpectrogram(sample_rate, n_fft, hop_length, n_mels, padding == "center")

    def forward(self, audio: Tensor) -> Tensor:
        if self.padding == "same":
            pad = self.mel_spec.win_length - self.mel_spec.hop_length
            audio = F.pad(audio, (pad // 2, pad // 2), mode="reflect")
        mel = self.mel_spec(audio)
        return torch.log(torch.clip(mel, min=1e-7))


class Vocos(nn.Module):
    def __init__(self, config: dict[str, Any]) -> None:
        super().__init__()
        self.config = config
        self.feature_extractor = MelSpectrogramFeatures(**config["feature_extractor"]["init_args"])
        self.backbone = VocosBackbone(**config["backbone"]["init_args"])
        self.head = ISTFTHead(**config["head"]["init_args"])

    def decode(self, features: Tensor) -> Tensor:
        return self.head(self.backbone(features))

    def forward(self, audio: Tensor) -> Tensor:
        return self.decode(self.feature_extractor(audio))


def vocos_config(
    *,
    n_mels: int = 12,
    dim: int = 16,
    intermediate_dim: int = 24,
    num_layers: int = 2,
    n_fft: int = 32,
    hop_length: int = 8,
    padding: str = "center",
    sample_rate: int = 8000,
    layer_scale_init_value: float | None = None,
) -> dict[str, Any]:
    """A tiny Vocos ``config.yaml`` (as a dict) in the Hub's layout."""
    backbone: dict[str, Any] = {
        "input_channels": n_mels,
        "dim": dim,
        "intermediate_dim": intermediate_dim,
        "num_layers": num_layers,
    }
    if layer_scale_init_value is not None:
        backbone["layer_scale_init_value"] = layer_scale_init_value
    features = {
        "sample_rate": sample_rate,
        "n_fft": n_fft,
        "hop_length": hop_length,
        "n_mels": n_mels,
        "padding": padding,
    }
    head = {"dim": dim, "n_fft": n_fft, "hop_length": hop_length, "padding": padding}
    return {
        "feature_extractor": {
            "class_path": "vocos.feature_extractors.MelSpectrogramFeatures",
            "init_args": features,
        },
        "backbone": {"class_path": "vocos.models.VocosBackbone", "init_args": backbone},
        "head": {"class_path": "vocos.heads.ISTFTHead", "init_args": head},
    }


def make_vocos(config: dict[str, Any], seed: int = 0) -> Vocos:
    """A Vocos with torch's default initialisation, random layer scales and norms, drawn from
    ``seed`` without touching the caller's generator state."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)  # allowed: a reference, inside fork_rng
        model = Vocos(config).eval()
        with torch.no_grad():
            for module in model.modules():
                if isinstance(module, nn.LayerNorm):
                    module.weight.add_(0.1 * torch.randn_like(module.weight))
                    module.bias.add_(0.1 * torch.randn_like(module.bias))
                if isinstance(module, ConvNeXtBlock) and module.gamma is not None:
                    module.gamma.uniform_(0.1, 1.0)
    return model


def save_vocos(model: Vocos, folder: Path) -> Path:
    """``config.yaml`` and ``pytorch_model.bin``, as ``charactr/vocos-mel-24khz`` has them."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(model.config, sort_keys=False))
    torch.save(model.state_dict(), folder / "pytorch_model.bin")
    return folder


def load_bigvgan(folder: Path) -> BigVGAN:
    """Upstream's ``BigVGAN.from_pretrained`` on a local folder, weights read safely."""
    h = json.loads((folder / "config.json").read_text())
    model = BigVGAN(h)
    if (folder / "bigvgan_generator.pt").exists():
        state = torch.load(folder / "bigvgan_generator.pt", weights_only=True)["generator"]
    else:
        from safetensors.torch import load_file

        state = load_file(str(folder / "model.safetensors"))
    model.load_state_dict(state)
    return model.eval()


def load_vocos(folder: Path) -> Vocos:
    """Upstream's ``Vocos.from_pretrained`` on a local folder, weights read safely."""
    import yaml

    model = Vocos(yaml.safe_load((folder / "config.yaml").read_text()))
    model.load_state_dict(torch.load(folder / "pytorch_model.bin", weights_only=True))
    return model.eval()


def remove_weight_norm(model: nn.Module) -> nn.Module:
    """What upstream's ``inference.py`` does before synthesis (``BigVGAN.remove_weight_norm``):
    each weight computed once by the same ``torch._weight_norm`` call, so the bits stay."""
    for module in model.modules():
        if hasattr(module, "weight_g"):
            nn.utils.remove_weight_norm(module)
    return model
