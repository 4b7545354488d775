"""ECAPA-TDNN against a re-derived SpeechBrain ``ECAPA_TDNN`` in the same process, bit for bit.

SpeechBrain is not installed, so the peer is ``benchmarks/_ref_ecapa.py``: plain ``torch.nn``
modules named and nested as upstream's, each forward written from upstream's source (loaded here
by its path, so neither the tests nor the benchmark import each other). Each checkpoint is a
randomly initialised reference (batch-norm running statistics drawn too) written as the Hub
ships it, ``hyperparams.yaml`` beside ``embedding_model.ckpt``; both sides read the same folder.
float32 on the CPU is compared with ``torch.equal``.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from types import ModuleType

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import HostCopies

from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import ecapa, load_speaker_encoder
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.runtime import Runtime
from mizuoto_runtime.weights.loading import LoadError
from mizuoto_sdk.errors import EngineUnavailable


def _reference() -> ModuleType:
    path = Path(__file__).parents[2] / "benchmarks" / "_ref_ecapa.py"
    spec = importlib.util.spec_from_file_location("_ref_ecapa", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


ref = _reference()
MELS = 24
SHAPES: dict[str, dict[str, object]] = {
    "small": {
        "channels": [16, 16, 16, 48],
        "kernel_sizes": [5, 3, 3, 1],
        "dilations": [1, 2, 3, 1],
        "attention_channels": 8,
        "res2net_scale": 4,
        "se_channels": 8,
        "lin_neurons": 12,
    },
    "no-global-context": {
        "channels": [8, 16, 16, 24],  # 8 -> 16: the first SE-Res2Net layer has a shortcut conv
        "kernel_sizes": [3, 3, 5, 1],
        "dilations": [1, 2, 1, 1],
        "attention_channels": 4,
        "res2net_scale": 2,
        "se_channels": 4,
        "global_context": False,
        "lin_neurons": 6,
    },
    "groups": {
        "channels": [16, 16, 16, 16, 32],
        "kernel_sizes": [3, 3, 3, 3, 1],
        "dilations": [1, 2, 3, 4, 1],
        "attention_channels": 8,
        "res2net_scale": 8,
        "se_channels": 4,
        "groups": [2, 4, 2, 4, 2],
        "lin_neurons": 10,
    },
    "even-kernels": {  # the first layer and the aggregation each shorten by a frame
        "channels": [12, 12, 12, 24],
        "kernel_sizes": [4, 3, 3, 2],
        "dilations": [1, 1, 2, 1],
        "attention_channels": 6,
        "res2net_scale": 3,
        "se_channels": 6,
        "lin_neurons": 8,
    },
    "scale-one": {
        "channels": [8, 8, 16],
        "kernel_sizes": [3, 3, 1],
        "dilations": [1, 1, 1],
        "res2net_scale": 1,
        "lin_neurons": 4,
    },
}


def save(directory: Path, fields: dict[str, object]) -> tuple[torch.nn.Module, Path]:
    return ref.save_folder(directory, n_mels=MELS, **fields), directory


def features(batch: int = 3, frames: int = 37, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, frames, MELS, generator=torch.Generator().manual_seed(seed))


LENGTHS = {1: torch.tensor([0.61]), 3: torch.tensor([1.0, 0.73, 0.3])}


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_is_bitwise_upstream_batch_one_and_three_with_and_without_lengths(
    tmp_path: Path, shape: str
) -> None:
    theirs, folder = save(tmp_path, SHAPES[shape])
    ours = ecapa.load(folder)
    for batch in (1, 3):
        x = features(batch)
        for lengths in (None, LENGTHS[batch]):
            with torch.no_grad():
                expected = theirs(x, lengths)
            out = ours(x, lengths)
            assert out.shape == (batch, 1, ours.config.lin_neurons)
            assert torch.equal(out, expected)


def test_relative_lengths_mask_the_padding_as_upstream_does(tmp_path: Path) -> None:
    theirs, folder = save(tmp_path, SHAPES["small"])
    ours = ecapa.load(folder)
    x = features(batch=2, frames=50)
    # Lengths whose frame counts round differently, a shortest utterance of one frame, and
    # lengths given as a list: each equals upstream, and the padded tail does not matter.
    for lengths in ([0.5, 0.02], [0.999, 0.41], [1.0, 1.0]):
        relative = torch.tensor(lengths)
        with torch.no_grad():
            expected = theirs(x, relative)
        assert torch.equal(ours(x, lengths), expected)
    # Past the mask and the convs' reach (at most 7 frames here), the tail does not matter.
    noisy = x.clone()
    noisy[1, 40:] = 100.0
    torch.testing.assert_close(ours(noisy, [1.0, 0.5]), ours(x, [1.0, 0.5]), rtol=0, atol=1e-6)
    assert not torch.allclose(ours(noisy), ours(x), rtol=0, atol=1e-2)
    with torch.no_grad():
        assert torch.equal(ours(noisy, [1.0, 0.5]), theirs(noisy, torch.tensor([1.0, 0.5])))


@st.composite
def configs(draw: st.DrawFn) -> dict[str, object]:
    """Any layout upstream builds and runs: SE-Res2Net kernels that keep the length."""
    layers = draw(st.integers(3, 5))
    scale = draw(st.sampled_from([1, 2, 4]))
    width = scale * draw(st.integers(1, 3))
    kernels = [draw(st.sampled_from([1, 3, 5])) for _ in range(layers)]
    kernels[0] = draw(st.integers(1, 5))
    kernels[-1] = draw(st.integers(1, 3))
    return {
        "channels": [width] * (layers - 1) + [draw(st.sampled_from([8, 12]))],
        "kernel_sizes": kernels,
        "dilations": [draw(st.integers(1, 3)) for _ in range(layers)],
        "attention_channels": draw(st.sampled_from([2, 5])),
        "res2net_scale": scale,
        "se_channels": draw(st.sampled_from([1, 3])),
        "global_context": draw(st.booleans()),
        "lin_neurons": draw(st.integers(1, 7)),
    }


@settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(config=configs(), extra=st.integers(0, 9), relative=st.floats(0.05, 1.0))
def test_any_config_upstream_runs_is_bitwise_upstream(
    tmp_path_factory: pytest.TempPathFactory, config: dict[str, object], extra: int, relative: float
) -> None:
    theirs, folder = save(tmp_path_factory.mktemp("ecapa"), config)
    ours = ecapa.load(folder)
    x = features(batch=2, frames=ours.min_frames + extra)
    lengths = torch.tensor([1.0, relative])
    with torch.no_grad():
        expected = theirs(x, lengths)
    assert torch.equal(ours(x, lengths), expected)


def test_bfloat16_is_within_the_measured_tolerance_of_float32_upstream(tmp_path: Path) -> None:
    # Upstream itself does not run in bfloat16 (its float32 masks meet bfloat16 weights), so
    # ours in bfloat16 is compared with upstream in float32. Measured: the largest difference is
    # 0.7% of the largest output on these shapes; the bound leaves a margin of about 3x.
    theirs, folder = save(tmp_path, SHAPES["small"])
    ours = ecapa.load(folder, dtype=torch.bfloat16)
    x = features(frames=60)
    for lengths in (None, LENGTHS[3]):
        with torch.no_grad():
            expected = theirs(x, lengths)
        out = ours(x, lengths)
        assert out.dtype == torch.bfloat16
        assert (out.float() - expected).abs().max() <= 0.02 * expected.abs().max()
        cosine = torch.nn.functional.cosine_similarity(out.float(), expected, dim=-1)
        assert bool((cosine > 0.999).all())


def test_building_draws_nothing_and_a_checkpoint_without_step_counters_loads(
    tmp_path: Path,
) -> None:
    theirs, folder = save(tmp_path, SHAPES["small"])
    state = torch.load(folder / "embedding_model.ckpt", weights_only=True)
    torch.save(
        {k: v for k, v in state.items() if not k.endswith("num_batches_tracked")},
        folder / "embedding_model.ckpt",
    )
    before = torch.random.get_rng_state()
    ours = ecapa.load(folder, name="speaker")
    assert torch.equal(torch.random.get_rng_state(), before)
    assert [h.name for h in ours.handles] == ["speaker:embedding_model"]
    with torch.no_grad():
        assert torch.equal(ours(features()), theirs(features()))


HYPERPARAMS = """\
n_mels: 24
size: !ref <n_mels>
embedding_model: !new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN
{entry}"""
ENTRY = {
    "input_size": "!ref <size>",
    "channels": "[16, 16, 16, 48]",
    "kernel_sizes": "[5, 3, 3, 1]",
    "dilations": "[1, 2, 3, 1]",
    "res2net_scale": "4",
}


def hyperparams(**overrides: str) -> str:
    """A hyperparams.yaml whose embedding_model entry is ENTRY with ``overrides``."""
    entry = {**ENTRY, **overrides}
    return HYPERPARAMS.format(entry="".join(f"    {k}: {v}\n" for k, v in entry.items()))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("lin_neurons", "0"),
        ("input_size", "!ref <n_mels> * 2"),
        ("input_size", "!ref <missing>"),
        ("input_size", "0"),
        ("activation", "!name:torch.nn.LeakyReLU"),
        ("kernel_sizes", "[5, 3, 3]"),
        ("kernel_sizes", "[5, 3, 2, 1]"),  # an odd reach shortens a Res2Net branch
        ("dilations", "[1, 2, 3, 1, 1]"),
        ("groups", "[1, 3, 1, 1]"),
        ("groups", "[1, 1]"),
        ("res2net_scale", "5"),
        ("global_context", "yes please"),
        ("channels", "[16, 48]"),
        ("attention_heads", "4"),
    ],
)
def test_a_config_it_cannot_honour_is_engine_unavailable_naming_the_field(
    tmp_path: Path, field: str, value: str
) -> None:
    # Refused before any weight is looked at: the folder holds no checkpoint.
    (tmp_path / "hyperparams.yaml").write_text(hyperparams(**{field: value}))
    with pytest.raises(EngineUnavailable, match=field):
        ecapa.load(tmp_path)


def test_the_entry_as_written_is_honoured_with_upstreams_defaults(tmp_path: Path) -> None:
    (tmp_path / "hyperparams.yaml").write_text(hyperparams(activation="!name:torch.nn.ReLU"))
    with pytest.raises(EngineUnavailable, match=r"embedding_model\.ckpt"):
        ecapa.load(tmp_path)  # the config passed; only the weights are missing
    config = ecapa.EcapaConfig.from_dict({"input_size": 80})
    assert config.channels == (512, 512, 512, 512, 1536)
    assert (config.lin_neurons, config.res2net_scale, config.global_context) == (192, 8, True)


def test_our_module_filled_by_init_random_saves_and_loads_back(tmp_path: Path) -> None:
    # The docs' example: a folder written from our own module, no reference needed.
    (tmp_path / "hyperparams.yaml").write_text(hyperparams())
    module = ecapa.EcapaTdnn(ecapa.EcapaConfig.from_dict(ecapa.read_hyperparams(tmp_path)))
    before = torch.random.get_rng_state()
    init_random(module, torch.Generator().manual_seed(0))
    assert torch.equal(torch.random.get_rng_state(), before)
    torch.save(module.state_dict(), tmp_path / "embedding_model.ckpt")
    x = features()
    with torch.no_grad():
        expected = module.eval()(x)
    assert torch.equal(ecapa.load(tmp_path)(x), expected)


def test_a_folder_that_is_not_an_ecapa_checkpoint_is_engine_unavailable(tmp_path: Path) -> None:
    with pytest.raises(EngineUnavailable, match=r"hyperparams\.yaml"):
        ecapa.load(tmp_path)
    (tmp_path / "hyperparams.yaml").write_text(
        "embedding_model: !new:speechbrain.lobes.models.Xvector.Xvector\n    in_channels: 24\n"
    )
    with pytest.raises(EngineUnavailable, match="ECAPA_TDNN"):
        ecapa.load(tmp_path)
    (tmp_path / "hyperparams.yaml").write_text(hyperparams())
    with pytest.raises(EngineUnavailable, match=r"embedding_model\.ckpt"):
        ecapa.load(tmp_path)
    (tmp_path / "embedding_model.ckpt").write_bytes(b"not a checkpoint")
    with pytest.raises(EngineUnavailable, match=r"embedding_model\.ckpt"):
        ecapa.load(tmp_path)


def test_a_checkpoint_of_another_shape_is_a_load_error_naming_the_tensor(tmp_path: Path) -> None:
    save(tmp_path, SHAPES["small"])
    hyperparams = tmp_path / "hyperparams.yaml"
    hyperparams.write_text(hyperparams.read_text().replace("se_channels: 8", "se_channels: 4"))
    with pytest.raises(LoadError, match=r"se_block\.conv1\.conv\.weight"):
        ecapa.load(tmp_path)


def test_bad_features_and_lengths_are_value_errors_naming_the_argument(tmp_path: Path) -> None:
    ours = ecapa.load(save(tmp_path, SHAPES["small"])[1])
    for bad in (
        torch.zeros(2, 30, MELS + 1),
        torch.zeros(30, MELS),
        torch.zeros(2, 30, MELS).long(),
        torch.zeros(2, ours.min_frames - 1, MELS),
    ):
        with pytest.raises(ValueError, match="features"):
            ours(bad)
    for lengths in ([1.0], [1.0, 0.0], [1.0, 1.5], torch.tensor([1, 1]), "long"):
        with pytest.raises(ValueError, match="lengths"):
            ours(torch.zeros(2, 30, MELS), lengths)  # type: ignore[arg-type]


def test_streamed_weights_give_the_resident_output_bitwise(tmp_path: Path) -> None:
    wide = {**SHAPES["groups"], "channels": [64, 64, 64, 64, 128], "attention_channels": 32}
    ours = ecapa.load(save(tmp_path, wide)[1])
    x, lengths = features(), LENGTHS[3]
    expected = ours(x, lengths)
    (handle,) = ours.handles
    slot = max(stage_bytes(p) for p in handle.unit_parts)
    budget = handle.base.nbytes + 2 * slot
    assert budget < handle.size_bytes
    rt = Runtime(simulate={"cpu": budget})
    rt.manager.register([handle], owner="ecapa@cpu")
    with HostCopies(handle.unit_parts) as copies, rt.manager.use(handle, working_bytes=0):
        out = ours(x, lengths)
    assert handle.streamed_bytes > 0 and copies.count > 0
    assert torch.equal(out, expected)


def test_threads_sharing_one_encoder_get_the_same_output(tmp_path: Path) -> None:
    ours = ecapa.load(save(tmp_path, SHAPES["small"])[1])
    inputs = [(features(seed=s, frames=30 + 7 * s), LENGTHS[3] * (1 - 0.1 * s)) for s in range(3)]
    expected = [ours(x, lengths) for x, lengths in inputs]
    outs: dict[int, torch.Tensor] = {}
    start = threading.Barrier(len(inputs))

    def work(i: int) -> None:
        start.wait()
        for _ in range(3):
            outs[i] = ours(*inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(outs[i], expected[i]) for i in range(len(inputs)))


@pytest.mark.cuda
def test_cuda_float32_matches_upstream_on_cuda(tmp_path: Path) -> None:
    theirs, folder = save(tmp_path, SHAPES["groups"])
    ours = ecapa.load(folder, device="cuda")
    x, lengths = features().cuda(), LENGTHS[3].cuda()
    with torch.no_grad():
        expected = theirs.cuda()(x, lengths)
    torch.testing.assert_close(ours(x, lengths), expected, rtol=0, atol=1e-5)


def test_the_runtime_loader_is_this_encoder_named_after_its_folder(tmp_path: Path) -> None:
    theirs, folder = save(tmp_path, SHAPES["small"])
    ours = load_speaker_encoder(folder)
    x = features(2)
    with torch.no_grad():
        assert torch.equal(ours(x, LENGTHS[3][:2]), theirs(x, LENGTHS[3][:2]))
    assert [h.name for h in ours.handles] == [f"ecapa_tdnn@{folder}:embedding_model"]
    named = load_speaker_encoder(folder, name="voice-a")
    assert [h.name for h in named.handles] == ["voice-a:embedding_model"]
