"""Loading a neural audio block from a checkpoint folder as the Hub ships it.

A folder holds ``config.json`` and ``model.safetensors`` (or shards with an index), as
transformers' ``save_pretrained`` writes them. Its ``model_type`` names the family; each family's
module builds the block from ``ops.default`` layers (nothing drawn, nothing initialised) and fills
it strictly with ``load_into``. The families each loader knows are the tables below.

Two vocoders have no transformers class and their folders no ``model_type``: BigVGAN and Vocos
are recognised by what their folders hold (``VOCODER_LAYOUTS``).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Layout:
    """How a folder without ``model_type`` shows its family: ``config`` holds every one of
    ``keys`` (and no ``model_type``); the weights are ``weights`` (its ``member`` entry, for a
    pickle holding more than one state dict) when that file is there, else the folder's
    safetensors or ``pytorch_model.bin``."""

    config: str
    keys: tuple[str, ...]
    module: str
    weights: str | None = None
    member: str | None = None


VOCODER_LAYOUTS = {
    "bigvgan": Layout(
        "config.json",
        ("resblock", "upsample_rates", "activation"),
        "mizuoto_runtime.nn.bigvgan",
        weights="bigvgan_generator.pt",
        member="generator",
    ),
    "vocos": Layout("config.yaml", ("backbone", "head"), "mizuoto_runtime.nn.vocos"),
}
"""Vocoder families recognised by their folder's layout, checked in this order after
``VOCODERS``' ``model_type``: NVIDIA's BigVGAN (``config.json`` of hyperparameters,
``bigvgan_generator.pt`` or ``model.safetensors``) and gemelo-ai's Vocos (``config.yaml`` naming
its parts' classes, ``pytorch_model.bin``)."""
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
    from mizuoto_runtime.weights.checkpoint import load_state_dict

    config = read_config(folder)
    model_type = config.get("model_type")
    module_name = families.get(model_type) if isinstance(model_type, str) else None
    if module_name is None:
        raise EngineUnavailable(
            f"{folder}: model_type {model_type!r} is not a {kind} this runtime builds; "
            f"known: {', '.join(sorted(families))}"
        )
    state_dict = load_state_dict(Path(folder))
    family = str(model_type)
    return _build(module_name, family, config, state_dict, folder, device, dtype, name)


def _build(
    module_name: str,
    family: str,
    config: Mapping[str, Any],
    state_dict: Mapping[str, Any],
    folder: str | PathLike[str],
    device: str,
    dtype: Any,
    name: str | None,
) -> Any:
    import torch

    module = importlib.import_module(module_name)
    # Handles are named after the folder unless the caller names them: the memory manager keys
    # what it learns of a model's working memory by its handles' names, and two checkpoints of
    # one family differ in size.
    return module.build(
        config,
        state_dict,
        device=device,
        dtype=torch.float32 if dtype is None else dtype,
        name=name or f"{family}@{Path(folder).resolve()}",
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
    """A vocoder from ``folder``: mel -> waveform. HiFi-GAN (SpeechT5HifiGan) by its
    ``model_type``; BigVGAN and Vocos, whose folders have none, by ``VOCODER_LAYOUTS``. ``name``
    as for ``load_codec`` (default ``FAMILY@FOLDER`` for those two)."""
    found = _vocoder_layout(Path(folder))
    if found is None:
        return _load("vocoder", VOCODERS, folder, device, dtype, name)
    family, layout, config = found
    weights = _layout_weights(Path(folder), layout)
    return _build(layout.module, family, config, weights, folder, device, dtype, name)


def load_speaker_encoder(
    folder: str | PathLike[str], *, device: str = "cpu", dtype: Any = None, name: str | None = None
) -> Any:
    """A speaker encoder from ``folder``: SpeechBrain's ECAPA-TDNN as its Hub folder ships it
    (``hyperparams.yaml``'s ``embedding_model`` entry, ``embedding_model.ckpt``); fbank features
    [B, T, n_mels] (and relative ``lengths``) -> embedding [B, 1, lin_neurons]. ``name`` as for
    ``load_codec`` (default ``ecapa_tdnn@FOLDER``)."""
    from mizuoto_runtime.nn import ecapa

    return ecapa.load(folder, device=device, dtype=dtype, name=name)


def _vocoder_layout(folder: Path) -> tuple[str, Layout, dict[str, Any]] | None:
    """The family of ``VOCODER_LAYOUTS`` the folder holds, with its config; ``None`` when its
    ``config.json`` has a ``model_type``, which then decides."""
    configs: dict[str, dict[str, Any]] = {}
    for file, reader in (("config.json", read_config), ("config.yaml", _read_yaml)):
        if (folder / file).is_file():
            configs[file] = reader(folder)
    if not configs:
        raise EngineUnavailable(
            f"{folder}: no config.json (a folder as save_pretrained writes it, or BigVGAN's) and "
            "no config.yaml (Vocos')"
        )
    if "model_type" in configs.get("config.json", {}):
        return None
    for family, layout in VOCODER_LAYOUTS.items():
        config = configs.get(layout.config)
        if config is not None and all(key in config for key in layout.keys):
            return family, layout, config
    looked = "; ".join(
        f"{family}: {layout.config} with {', '.join(layout.keys)}"
        for family, layout in VOCODER_LAYOUTS.items()
    )
    raise EngineUnavailable(
        f"{folder}: model_type None is not a vocoder this runtime builds; known: "
        f"{', '.join(sorted(VOCODERS))} by model_type, and without one {looked}"
    )


def _read_yaml(folder: str | PathLike[str]) -> dict[str, Any]:
    """The folder's ``config.yaml`` (Vocos'), read with PyYAML's safe loader."""
    path = Path(folder) / "config.yaml"
    try:
        import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs
    except ImportError:
        raise EngineUnavailable(
            f"{path}: reading a Vocos config.yaml needs PyYAML (pip install pyyaml)"
        ) from None
    try:
        config = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise EngineUnavailable(f"{path}: not a readable YAML config: {error}") from error
    if not isinstance(config, dict):
        raise EngineUnavailable(f"{path}: expected a YAML mapping, got {type(config).__name__}")
    return config


def _layout_weights(folder: Path, layout: Layout) -> Any:
    from mizuoto_runtime.weights.checkpoint import load_state_dict

    if layout.weights is not None and (folder / layout.weights).is_file():
        return load_state_dict(folder / layout.weights, member=layout.member)
    return load_state_dict(folder)


def load_speech_encoder(
    folder: str | PathLike[str], *, device: str = "cpu", dtype: Any = None, name: str | None = None
) -> Any:
    """A speech encoder (wav2vec 2.0, HuBERT, WavLM) from ``folder``: audio -> hidden states.
    ``name`` as for ``load_codec``."""
    return _load("speech encoder", SPEECH_ENCODERS, folder, device, dtype, name)
