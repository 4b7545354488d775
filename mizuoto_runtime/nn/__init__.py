"""Neural audio blocks that load Hub checkpoints and equal upstream: codecs, vocoders, speech
encoders, speaker encoders and flow-matching solvers. Loaded on first use; see ``loaders``."""

from __future__ import annotations

from mizuoto_runtime.nn.loaders import (
    load_codec,
    load_speaker_encoder,
    load_speech_encoder,
    load_vocoder,
)

__all__ = ["load_codec", "load_speaker_encoder", "load_speech_encoder", "load_vocoder"]
