"""The nn loaders: the family from config.json's model_type, an unknown one named with the known
ones, and handles named after the folder (or the caller's name), so that two checkpoints of one
family never share what the memory manager learns of a model's working memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_nn_hifigan as hifigan_tests

from mizuoto_runtime.nn import load_codec, load_speech_encoder, load_vocoder
from mizuoto_sdk.errors import EngineUnavailable


def test_two_folders_of_one_family_get_handles_of_their_own(tmp_path: Path):
    small = hifigan_tests.save(tmp_path / "small")[1]
    big = hifigan_tests.save(tmp_path / "big", upsample_initial_channel=32)[1]
    names = [h.name for folder in (small, big) for h in load_vocoder(folder).handles]
    assert len(set(names)) == 2, names
    assert all(name.startswith("speecht5_hifigan@") for name in names), names
    [named] = load_vocoder(small, name="voice-a").handles
    assert named.name == "voice-a:vocoder"


@pytest.mark.parametrize("load", [load_codec, load_vocoder, load_speech_encoder])
def test_an_unknown_model_type_is_unavailable_naming_the_known_ones(load, tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bark"}))
    with pytest.raises(EngineUnavailable, match=r"model_type 'bark'.*known: "):
        load(tmp_path)


def test_a_folder_without_config_is_unavailable(tmp_path: Path):
    with pytest.raises(EngineUnavailable, match=r"no config\.json"):
        load_codec(tmp_path)
