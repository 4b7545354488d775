"""Vocos against a re-derived reference of gemelo-ai/vocos' forward, in the same process, bit
for bit.

The reference (``benchmarks/_ref_vocoders.py``, loaded by its path: one copy serves these tests
and the benchmark) is upstream's ``Vocos`` with ``MelSpectrogramFeatures``, ``VocosBackbone`` and
``ISTFTHead`` as plain ``torch.nn`` modules with upstream's names and buffers (torchaudio's
``MelSpectrogram`` steps re-derived), randomly initialised and saved as the Hub ships it:
``config.yaml`` with class paths and ``pytorch_model.bin``. float32 on the CPU is compared with
``torch.equal``; bfloat16 too, against the reference after ``.to(torch.bfloat16)`` (both heads turn
the spectrum complex64, so both waveforms are float32).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from small_models import HostCopies

from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import load_vocoder, vocos
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import EngineUnavailable


def _reference():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "_ref_vocoders.py"
    spec = importlib.util.spec_from_file_location("_ref_vocoders", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _reference()
SHAPES = {
    "center": {"padding": "center"},
    "same": {"padding": "same"},
    "wide-deep-center": {"dim": 24, "intermediate_dim": 40, "num_layers": 3, "n_mels": 8},
    "same-odd-hop-scale": {
        "padding": "same",
        "n_fft": 24,
        "hop_length": 5,
        "num_layers": 1,
        "layer_scale_init_value": 0.5,
    },
    "no-gamma": {"n_fft": 16, "hop_length": 4, "layer_scale_init_value": -1.0},
}


def save(directory: Path, seed: int = 0, **overrides):
    model = ref.make_vocos(ref.vocos_config(**overrides), seed)
    return model, ref.save_vocos(model, directory)


def mel(mels: int = 12, batch: int = 2, frames: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, mels, frames, generator=torch.Generator().manual_seed(seed))


def audio(batch: int = 2, samples: int = 101, seed: int = 2) -> torch.Tensor:
    return 0.3 * torch.randn(batch, samples, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_decode_is_bitwise_upstream_batched_unbatched_and_shortest(
    tmp_path: Path, shape: str
):
    theirs, folder = save(tmp_path, **SHAPES[shape])
    ours = load_vocoder(folder)
    mels = ours.config.n_mels
    shortest = ours.config.shortest_mel  # upstream's center ISTFT fails on one frame
    x, short = mel(mels), mel(mels, frames=shortest)
    with torch.no_grad():
        expected, expected_one = theirs.decode(x), theirs.decode(x[1:])[0]
        expected_short = theirs.decode(short)
    assert torch.equal(ours(x), expected)
    assert torch.equal(ours(x[1]), expected_one)
    assert torch.equal(ours(short), expected_short)
    if shortest > 1:
        with pytest.raises(ValueError, match="at least 2 frame"):
            ours(short[..., :1])
    assert expected.abs().max() > 1e-3


@pytest.mark.parametrize("shape", ["center", "same-odd-hop-scale"])
def test_features_and_copy_synthesis_are_bitwise_upstream(tmp_path: Path, shape: str):
    theirs, folder = save(tmp_path, **SHAPES[shape])
    ours = load_vocoder(folder)
    wave = audio()
    with torch.no_grad():
        features, synthesis = theirs.feature_extractor(wave), theirs(wave)
    assert torch.equal(ours.features(wave), features)
    assert torch.equal(ours.features(wave[0]), features[0])
    assert torch.equal(ours(ours.features(wave)), synthesis)


@pytest.mark.parametrize("shape", ["center", "same"])
def test_bfloat16_is_bitwise_upstream_in_bfloat16(tmp_path: Path, shape: str):
    theirs, folder = save(tmp_path, **SHAPES[shape])
    ours = load_vocoder(folder, dtype=torch.bfloat16)
    x, wave = mel(), audio()
    with torch.no_grad():
        features = theirs.feature_extractor(wave)  # torch's CPU FFT has no bfloat16
        exact = theirs.decode(x)
        expected = theirs.to(torch.bfloat16).decode(x.bfloat16())
    out = ours(x)
    assert ours.dtype == torch.bfloat16 and out.dtype == expected.dtype == torch.float32
    assert torch.equal(out, expected)
    assert torch.equal(ours.features(wave), features)
    # bfloat16's own rounding (8 significant bits) before the complex64 head: measured up to
    # 3.6e-3 on outputs of about 0.4; the bound leaves room for other kernels' summation orders.
    torch.testing.assert_close(out, exact, rtol=0, atol=1e-2)


def test_building_draws_nothing_and_the_handle_streams_the_blocks(tmp_path: Path):
    _, folder = save(tmp_path, num_layers=3)
    before = torch.random.get_rng_state()
    ours = load_vocoder(folder)
    assert torch.equal(torch.random.get_rng_state(), before)
    (handle,) = ours.handles
    assert handle.name == f"vocos@{folder.resolve()}:vocoder"
    assert len(handle.unit_parts) == 3
    assert ours.sample_rate == 8000 and ours.hop_length == 8


def _config(**changes: object) -> dict:
    config = ref.vocos_config()
    for dotted, value in changes.items():
        part, key = dotted.split("__")
        if key == "class_path":
            config[part]["class_path"] = value
        else:
            config[part]["init_args"][key] = value
    return config


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"backbone__adanorm_num_embeddings": 4}, "adanorm_num_embeddings"),
        (
            {"feature_extractor__class_path": "vocos.feature_extractors.EncodecFeatures"},
            "class_path",
        ),
        ({"head__class_path": "vocos.heads.IMDCTCosHead"}, "head.class_path"),
        ({"backbone__class_path": "vocos.models.VocosResNetBackbone"}, "backbone.class_path"),
        ({"head__n_fft": 31}, "n_fft"),
        ({"head__hop_length": 31, "head__padding": "same"}, "hop_length"),
        ({"head__padding": "valid"}, "padding"),
        ({"head__dim": 8}, "head.init_args.dim"),
        ({"backbone__num_layers": 0}, "num_layers"),
        ({"feature_extractor__n_mels": "many"}, "n_mels"),
    ],
)
def test_a_config_it_cannot_build_is_engine_unavailable_naming_the_field(changes, named: str):
    with pytest.raises(EngineUnavailable, match=named):
        vocos.build(_config(**changes), {}, device="cpu", dtype=torch.float32)


def test_bad_input_is_a_value_error_naming_the_argument(tmp_path: Path):
    ours = load_vocoder(save(tmp_path)[1])
    for bad in (torch.zeros(2, 13, 3), torch.zeros(1, 1, 12, 3), torch.zeros(12, 3).long()):
        with pytest.raises(ValueError, match="mel"):
            ours(bad)
    for bad in (torch.zeros(1, 1, 100), torch.zeros(2, 16), torch.zeros(100).long()):
        with pytest.raises(ValueError, match="audio"):
            ours.features(bad)


def test_streamed_weights_give_the_resident_output_bitwise(tmp_path: Path):
    ours = load_vocoder(save(tmp_path, dim=64, intermediate_dim=128, num_layers=4)[1])
    x = mel()
    expected = ours(x)
    (handle,) = ours.handles
    slot = max(stage_bytes(p) for p in handle.unit_parts)
    budget = handle.base.nbytes + 2 * slot
    assert budget < handle.size_bytes
    rt = Runtime(simulate={"cpu": budget})
    rt.manager.register([handle], owner="vocos@cpu")
    with HostCopies(handle.unit_parts) as copies, rt.manager.use(handle, working_bytes=0):
        out = ours(x)
    assert handle.streamed_bytes > 0 and copies.count > 0
    assert torch.equal(out, expected)


@pytest.mark.cuda
def test_cuda_float32_matches_upstream_on_cuda(tmp_path: Path):
    theirs, folder = save(tmp_path, **SHAPES["same"])
    ours = load_vocoder(folder, device="cuda")
    x = mel().cuda()
    with torch.no_grad():
        expected = theirs.cuda().decode(x)
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
