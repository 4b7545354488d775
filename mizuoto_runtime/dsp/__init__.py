"""Signal processing equal to what real models were trained with: librosa, Whisper, HiFi-GAN, Kaldi.

Each function names the upstream it reproduces and how exactly (docs/runtime/dsp.md):

- ``mel_filters``, ``melspectrogram``: librosa's, bitwise, with numpy alone
- ``whisper_log_mel``: ``whisper.audio.log_mel_spectrogram``, bitwise
- ``hifigan_mel``: HiFi-GAN's ``meldataset.mel_spectrogram``, bitwise
- ``kaldi_fbank``: ``torchaudio.compliance.kaldi.fbank``'s algorithm and options
- ``stft``, ``istft``: ``torch.stft`` / ``torch.istft`` with a Hann window by default
- ``resample``: the runtime's own Kaiser-windowed sinc

Importing this package never imports torch: the numpy functions load with it, the torch ones on
first use (PEP 562).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mizuoto_runtime.dsp.mel import mel_filters, melspectrogram
from mizuoto_runtime.dsp.resample import resample

if TYPE_CHECKING:
    from mizuoto_runtime.dsp.fourier import istft, stft
    from mizuoto_runtime.dsp.hifigan import hifigan_mel
    from mizuoto_runtime.dsp.kaldi import kaldi_fbank
    from mizuoto_runtime.dsp.whisper import whisper_log_mel

# name -> the module that defines it, imported on first use because it imports torch
_WHERE = {
    "stft": "mizuoto_runtime.dsp.fourier",
    "istft": "mizuoto_runtime.dsp.fourier",
    "hifigan_mel": "mizuoto_runtime.dsp.hifigan",
    "kaldi_fbank": "mizuoto_runtime.dsp.kaldi",
    "whisper_log_mel": "mizuoto_runtime.dsp.whisper",
}

__all__ = [
    "hifigan_mel",
    "istft",
    "kaldi_fbank",
    "mel_filters",
    "melspectrogram",
    "resample",
    "stft",
    "whisper_log_mel",
]

# As in mizuoto_runtime/__init__.py: type checkers read the imports above, never __getattr__.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Import the torch module behind ``name`` on first use and keep the value here."""
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
