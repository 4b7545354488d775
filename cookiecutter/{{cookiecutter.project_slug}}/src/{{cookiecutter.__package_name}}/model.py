{%- set convert = cookiecutter.capabilities == "synthesize+convert" -%}
{%- if cookiecutter.uses_torch -%}
"""The model: replace ``TinyVoice`` with yours, and the engine around it stays as it is.

``TinyVoice`` is a stand-in shaped like a real speech model, so that the engine runs end to end
before yours exists: an embedding and a linear head turn each character of a word into a pitch and
a loudness, and an oscillator renders them as one tone per character{% if convert %}; for convert,
a short convolution, soft-clipped, reshapes the input audio{% endif %}. Its layers come from
``ops.default``, which allocates without initialising: constructing even a large model costs
nothing and draws no random numbers. ``build`` then fills them from a checkpoint, or from a fixed
seed while there is none, so that every load on every machine gives the same weights.
"""

from __future__ import annotations

from pathlib import Path

import torch
{%- if convert %}
import torch.nn.functional as F
{%- endif %}
from torch import Tensor, nn

from mizuoto_runtime import load_into, load_state_dict, ops
{%- if convert %}
from mizuoto_sdk import AudioChunk
{%- endif %}

SAMPLE_RATE = 16_000
NOTE_SECONDS = 0.05  # one character's tone, at speed 1
VOCABULARY = 256  # the bytes of UTF-8 text
WEIGHTS_SEED = 0  # the stand-in weights: the same on every load, on every machine
{%- if convert %}
KERNEL = 9  # convert's filter taps: KERNEL // 2 samples of context on each side
{%- endif %}


class TinyVoice(nn.Module):
    """Replace: your model's layers, built from ``ops.default`` so that construction is free."""

    sample_rate = SAMPLE_RATE
{%- if convert %}
    context = KERNEL // 2
{%- endif %}

    def __init__(self, width: int = 32) -> None:
        super().__init__()
        self.embed = ops.default.Embedding(VOCABULARY, width)
        self.head = ops.default.Linear(width, 2)
{%- if convert %}
        self.timbre = ops.default.Conv1d(1, 1, KERNEL, bias=False)
{%- endif %}

    def forward(self, codes: Tensor, jitter: Tensor) -> tuple[Tensor, Tensor]:
        """Byte codes and seeded noise [chars] -> pitch (Hz) and loudness [chars], in float32."""
        hidden = torch.tanh(self.embed(codes))  # [chars, width], in the model's dtype
        pitch, loudness = self.head(hidden).float().unbind(-1)  # [chars] each
        hertz = 220.0 * torch.exp2(torch.tanh(pitch) + 0.02 * jitter)  # about 110 to 440 Hz
        return hertz, 0.1 + 0.2 * torch.sigmoid(loudness)

    def speak(self, word: str, speed: float, generator: torch.Generator) -> Tensor:
        """One word -> its samples [chars * note], float32 on the model's device."""
        device = self.embed.weight.device
        codes = torch.tensor(list(word.encode()), device=device)  # [chars]
        jitter = torch.randn(len(codes), generator=generator, device=device)
        hertz, loudness = self(codes, jitter)
        note = round(self.sample_rate * NOTE_SECONDS / speed)
        t = torch.arange(note, device=device) / self.sample_rate  # [note]
        envelope = torch.hann_window(note, periodic=False, device=device)  # no clicks
        tones = torch.sin(2 * torch.pi * hertz[:, None] * t) * envelope  # [chars, note]
        return (loudness[:, None] * tones).reshape(-1)
{%- if convert %}

    def prepare(self, audio: AudioChunk) -> Tensor:
        """Any AudioChunk -> mono float32 at the model's rate, ``context`` zeros on each side."""
        device = self.embed.weight.device
        samples = audio.samples
        if isinstance(samples, Tensor):
            samples = samples.detach().to(device, torch.float32)
        else:
            samples = torch.tensor(samples, dtype=torch.float32, device=device)  # a copy
        if samples.ndim == 2:
            samples = samples.mean(0)  # [n]
        if audio.sample_rate != self.sample_rate:
            length = max(1, round(samples.shape[-1] * self.sample_rate / audio.sample_rate))
            resized = F.interpolate(samples[None, None], size=length, mode="linear")
            samples = resized[0, 0]
        return F.pad(samples, (self.context, self.context))

    def transform(self, window: Tensor, drive: float) -> Tensor:
        """A block with its context [context + n + context] -> the converted block [n]."""
        weight = self.timbre.weight
        filtered = self.timbre(window.to(weight.dtype)[None, None])[0, 0].float()  # [n]
        return torch.tanh(drive * filtered)
{%- endif %}


def build(model_dir: Path | None, device: str, dtype: str) -> TinyVoice:
    """The model on ``device`` in ``dtype``, from the checkpoint in ``model_dir`` if given."""
    if model_dir is None:
        # Replace: stand-in weights from a seeded generator of their own (never the global one),
        # until the manifest's ModelEntry names your checkpoint's files.
        model = ops.init_random(TinyVoice(), torch.Generator().manual_seed(WEIGHTS_SEED))
        model = model.to(device=device, dtype=getattr(torch, dtype))
    else:
        model = TinyVoice().to(device=device, dtype=getattr(torch, dtype))
        load_into(model, load_state_dict(model_dir, device=device), cast=True)
    return model.eval().requires_grad_(False)
{%- else -%}
"""The model: replace ``TinyVoice`` with yours, and the engine around it stays as it is.

``TinyVoice`` is a stand-in shaped like a real model, so that the engine runs end to end before
yours exists: a table of weights turns each character of a word into a pitch and a loudness, and
an oscillator renders them as one tone per character{% if convert %}; for convert, a short filter,
soft-clipped, reshapes the input audio{% endif %}. It computes with numpy on the CPU. ``build``
reads its weights from a checkpoint, or draws stand-in weights from a generator with a fixed seed,
so that every load on every machine gives the same weights.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
{%- if convert %}

from mizuoto_sdk import AudioChunk
{%- endif %}

SAMPLE_RATE = 16_000
NOTE_SECONDS = 0.05  # one character's tone, at speed 1
VOCABULARY = 256  # the bytes of UTF-8 text
WEIGHTS_SEED = 0  # the stand-in weights: the same on every load, on every machine
{%- if convert %}
KERNEL = 9  # convert's filter taps: KERNEL // 2 samples of context on each side
{%- endif %}


class TinyVoice:
    """Replace: your model. It holds arrays where a neural model holds layers."""

    sample_rate = SAMPLE_RATE
{%- if convert %}
    context = KERNEL // 2
{%- endif %}

{%- if convert %}

    def __init__(self, table: np.ndarray, taps: np.ndarray) -> None:
        self.table = table  # [VOCABULARY, 2]: pitch and loudness, before squashing, per byte
        self.taps = taps  # [KERNEL]
{%- else %}

    def __init__(self, table: np.ndarray) -> None:
        self.table = table  # [VOCABULARY, 2]: pitch and loudness, before squashing, per byte
{%- endif %}

    def speak(self, word: str, speed: float, rng: np.random.Generator) -> np.ndarray:
        """One word -> its samples [chars * note], float32."""
        codes = np.frombuffer(word.encode(), dtype=np.uint8)  # [chars]
        jitter = rng.standard_normal(len(codes), dtype=np.float32)
        pitch, loudness = self.table[codes].T  # [chars] each
        hertz = 220.0 * np.exp2(np.tanh(pitch) + 0.02 * jitter)  # about 110 to 440 Hz
        level = 0.1 + 0.2 / (1 + np.exp(-loudness))
        note = round(self.sample_rate * NOTE_SECONDS / speed)
        t = np.arange(note, dtype=np.float32) / self.sample_rate  # [note]
        envelope = np.hanning(note).astype(np.float32)  # no clicks
        tones = np.sin(2 * np.pi * hertz[:, None] * t) * envelope  # [chars, note]
        return (level[:, None] * tones).reshape(-1).astype(np.float32)
{%- if convert %}

    def prepare(self, audio: AudioChunk) -> np.ndarray:
        """Any AudioChunk -> mono float32 at the model's rate, ``context`` zeros on each side."""
        samples = audio.samples
        if hasattr(samples, "detach"):  # a torch tensor, handed on from another engine
            samples = samples.detach().float().cpu().numpy()
        samples = np.array(samples, dtype=np.float32)  # a copy: the input stays as it was
        if samples.ndim == 2:
            samples = samples.mean(0)  # [n]
        if audio.sample_rate != self.sample_rate:
            length = max(1, round(len(samples) * self.sample_rate / audio.sample_rate))
            step = audio.sample_rate / self.sample_rate
            positions = (np.arange(length) + 0.5) * step - 0.5
            samples = np.interp(positions, np.arange(len(samples)), samples).astype(np.float32)
        return np.pad(samples, self.context)

    def transform(self, window: np.ndarray, drive: float) -> np.ndarray:
        """A block with its context [context + n + context] -> the converted block [n]."""
        filtered = np.correlate(window, self.taps, mode="valid")  # [n]
        return np.tanh(drive * filtered).astype(np.float32)
{%- endif %}


def build(model_dir: Path | None) -> TinyVoice:
    """The model, from the checkpoint in ``model_dir`` if there is one."""
    if model_dir is None:
        # Replace: stand-in weights from a seeded generator of their own (never the global one),
        # until the manifest's ModelEntry names your checkpoint's files.
        rng = np.random.default_rng(WEIGHTS_SEED)
        table = rng.standard_normal((VOCABULARY, 2), dtype=np.float32)
{%- if convert %}
        taps = rng.uniform(-1 / 3, 1 / 3, KERNEL).astype(np.float32)
        return TinyVoice(table, taps)
    with np.load(model_dir / "model.npz") as weights:
        return TinyVoice(weights["table"], weights["taps"])
{%- else %}
        return TinyVoice(table)
    with np.load(model_dir / "model.npz") as weights:
        return TinyVoice(weights["table"])
{%- endif %}
{%- endif %}
