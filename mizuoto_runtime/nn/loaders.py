"""Loading a neural audio block from a checkpoint folder as the Hub ships it.

A folder holds ``config.json`` and ``model.safetensors`` (or shards with an index), as
transformers' ``save_pretrained`` writes them. Its ``model_type`` names the family; each family's
module builds the block from ``ops.default`` layers (nothing drawn, nothing initialised) and fills
it strictly with ``load_into``. The families each loader knows are the tables below.
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from os import PathLike
from pathlib import Path
from typing import Any

from mizuoto_sdk.errors import EngineUnavailable

CODECS = {
    "encodec": "mizuoto_runtime.nn.encodec",
    "dac": "mizuoto_runtime.nn.dac",
    "mimi": "mizuoto_runtime.nn.mimi",
}
"""model_type -> the module whose ``build(config, state_dict, device=, dtype=)`` makes a codec:
``encode(audio [B, C, T]) -> codes``, ``decode(codes) -> audio [B, C, T]``."""
VOCODERS = {
    "speecht5_hifigan": "mizuoto_runtime.nn.hifigan",
}
"""model_type -> the module that makes a vocoder: a callable mel -> waveform."""
SPEECH_ENCODERS = {
    "wav2vec2": "mizuoto_runtime.nn.wav2vec2",
    "hubert": "mizuoto_runtime.nn.wav2vec2",
    "wavlm": "mizuoto_runtime.nn.wav2vec2",
}
"""model_type -> the module that makes a speech encoder: audio [B, T] -> every hidden state."""


def read_config(folder: str | PathLike[str]) -> dict[str, Any]:
    """The folder's ``config.json``; a missing or unreadable one is ``EngineUnavailable``."""
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise EngineUnavailable(
            f"{folder}: no config.json (a folder as save_pretrained writes it)"
        ) from None
    except (OSError, ValueError) as error:
        raise EngineUnavailable(f"{path}: not a readable JSON config: {error}") from error
    if not isinstance(config, dict):
        raise EngineUnavailable(f"{path}: expected a JSON object, got {type(config).__name__}")
    return config


def _load(
    kind: str,
    families: Mapping[str, str],
    folder: str | PathLike[str],
    device: str,
    dtype: Any,
    name: str | None,
) -> Any:
    import torch

    from mizuoto_runtime.weights.checkpoint import load_state_dict

    config = read_config(folder)
    model_type = config.get("model_type")
    module_name = families.get(model_type) if isinstance(model_type, str) else None
    if module_name is None:
        raise EngineUnavailable(
            f"{folder}: model_type {model_type!r} is not a {kind} this runtime builds; "
            f"known: {', '.join(sorted(families))}"
        )
    module = importlib.import_module(module_name)
    state_dict = load_state_dict(Path(folder))
    # Handles are named after the folder unless the caller names them: the memory manager keys
    # what it learns of a model's working memory by its handles' names, and two checkpoints of
    # one family differ in size.
    return module.build(
        config,
        state_dict,
        device=device,
        dtype=torch.float32 if dtype is None else dtype,
        name=name or f"{model_type}@{Path(folder).resolve()}",
    )


def load_codec(
    folder: str | PathLike[str], *, device: str = "cpu", dtype: Any = None, name: str | None = None
) -> Any:
    """A codec (EnCodec, DAC, Mimi) from ``folder``: ``encode`` and ``decode`` as transformers'.
    ``name`` prefixes its handles' names (default: ``MODEL_TYPE@FOLDER``)."""
    return _load("codec", CODECS, folder, device, dtype, name)


def load_vocoder(
    folder: str | PathLike[str], *, device: str = "cpu", dtype: Any = None, name: str | None = None
) -> Any:
    """A vocoder (HiFi-GAN as SpeechT5HifiGan) from ``folder``: mel -> waveform. ``name`` as for
    ``load_codec``."""
    return _load("vocoder", VOCODERS, folder, device, dtype, name)


def load_speech_encoder(
    folder: str | PathLike[str], *, device: str = "cpu", dtype: Any = None, name: str | None = None
) -> Any:
    """A speech encoder (wav2vec 2.0, HuBERT, WavLM) from ``folder``: audio -> hidden states.
    ``name`` as for ``load_codec``."""
    return _load("speech encoder", SPEECH_ENCODERS, folder, device, dtype, name)
