"""The nn loaders: the family from config.json's model_type, an unknown one named with the known
ones, and handles named after the folder (or the caller's name), so that two checkpoints of one
family never share what the memory manager learns of a model's working memory. Vocoders without a
model_type (BigVGAN, Vocos) are recognised by their folders' layout, and a folder of neither names
what was looked for."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import test_nn_bigvgan as bigvgan_tests
import test_nn_hifigan as hifigan_tests
import test_nn_vocos as vocos_tests
import torch

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


def test_model_type_less_vocoders_are_recognised_by_their_folders(tmp_path: Path):
    big = bigvgan_tests.save(tmp_path / "big")[1]
    small = vocos_tests.save(tmp_path / "small")[1]
    assert [h.name for h in load_vocoder(big).handles] == [f"bigvgan@{big.resolve()}:vocoder"]
    assert [h.name for h in load_vocoder(small).handles] == [f"vocos@{small.resolve()}:vocoder"]
    [named] = load_vocoder(small, name="voice-b").handles
    assert named.name == "voice-b:vocoder"


def test_a_config_json_with_a_model_type_decides_over_a_vocos_yaml(tmp_path: Path):
    folder = hifigan_tests.save(tmp_path)[1]
    vocos_tests.save(tmp_path / "vocos")
    (folder / "config.yaml").write_text((tmp_path / "vocos" / "config.yaml").read_text())
    [handle] = load_vocoder(folder).handles
    assert handle.name.startswith("speecht5_hifigan@")


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ({}, r"no config\.json .*and no config\.yaml"),
        ({"config.json": "{}"}, r"bigvgan: config\.json with resblock, upsample_rates, activation"),
        ({"config.yaml": "head: {}\n"}, r"vocos: config\.yaml with backbone, head"),
        ({"config.yaml": "- a list\n"}, r"config\.yaml: expected a YAML mapping"),
    ],
)
def test_a_vocoder_folder_of_no_known_layout_names_what_was_looked_for(
    tmp_path: Path, files: dict[str, str], named: str
):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(EngineUnavailable, match=named):
        load_vocoder(tmp_path)


def test_a_bigvgan_generator_pt_holding_code_is_refused_unloaded(tmp_path: Path):
    folder = bigvgan_tests.save(tmp_path)[1]
    state = torch.load(folder / "bigvgan_generator.pt")["generator"]
    torch.save({"generator": state, "hparams": Path("x")}, folder / "bigvgan_generator.pt")
    with pytest.raises(EngineUnavailable, match="refused: the file holds code"):
        load_vocoder(folder)
