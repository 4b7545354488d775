"""HiFi-GAN against transformers' SpeechT5HifiGan in the same process, bit for bit.

Each checkpoint is a randomly initialised tiny SpeechT5HifiGan (random ``mean`` / ``scale`` too)
written with ``save_pretrained``; both sides read the same folder. float32 and bfloat16 on the CPU
are compared with ``torch.equal`` (bfloat16: ours loaded with ``dtype=`` against theirs after
``.to(torch.bfloat16)``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import HostCopies
from transformers import SpeechT5HifiGan, SpeechT5HifiGanConfig

from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import hifigan, load_vocoder
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import EngineUnavailable

MELS = 12
SHAPES = {
    "two-stages": {"upsample_rates": [4, 4], "upsample_kernel_sizes": [8, 8]},
    "uneven": {
        "upsample_rates": [3, 2, 2],
        "upsample_kernel_sizes": [7, 4, 5],
        "resblock_kernel_sizes": [3, 5],
        "resblock_dilation_sizes": [[1, 2], [1, 3, 5]],
        "leaky_relu_slope": 0.2,
        "normalize_before": False,
    },
    "one-kernel": {
        "upsample_rates": [5],
        "upsample_kernel_sizes": [11],
        "resblock_kernel_sizes": [7],
        "resblock_dilation_sizes": [[2]],
        "upsample_initial_channel": 8,
    },
}


def save(directory: Path, seed: int = 0, **overrides: object) -> tuple[SpeechT5HifiGan, Path]:
    fields: dict[str, object] = {"model_in_dim": MELS, "upsample_initial_channel": 16}
    fields.update(overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = SpeechT5HifiGan(SpeechT5HifiGanConfig(**fields)).eval()
        with torch.no_grad():
            model.mean.normal_()
            model.scale.uniform_(0.5, 2.0)
    model.save_pretrained(directory)
    return model, directory


def mel(batch: int = 2, frames: int = 9, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, frames, MELS, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_is_bitwise_upstream_batched_and_unbatched(tmp_path: Path, shape: str):
    theirs, folder = save(tmp_path, **SHAPES[shape])
    ours = load_vocoder(folder)
    x, single_frame = mel(), mel(frames=1)  # a length-1 time axis restrides where ops differ
    with torch.no_grad():
        expected, expected_one = theirs(x), theirs(x[1])
        expected_single = theirs(single_frame)
    assert torch.equal(ours(x), expected)
    assert torch.equal(ours(x[1]), expected_one)
    assert torch.equal(ours(single_frame), expected_single)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, object]:
    """Any layout upstream runs: rates with kernels at least as long, odd residual kernels."""
    rates = draw(st.lists(st.integers(1, 4), min_size=1, max_size=3))
    kernels = [draw(st.integers(rate, 2 * rate + 1)) for rate in rates]
    blocks = draw(st.integers(1, 2))
    return {
        "upsample_rates": rates,
        "upsample_kernel_sizes": kernels,
        "resblock_kernel_sizes": draw(
            st.lists(st.sampled_from([1, 3, 5]), min_size=blocks, max_size=blocks)
        ),
        "resblock_dilation_sizes": [
            draw(st.lists(st.integers(1, 4), min_size=1, max_size=3)) for _ in range(blocks)
        ],
        "leaky_relu_slope": draw(st.sampled_from([0.1, 0.3])),
        "normalize_before": draw(st.booleans()),
        "upsample_initial_channel": draw(st.sampled_from([8, 12])),
    }


@settings(
    max_examples=4,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(config=configs(), frames=st.integers(1, 12))
def test_any_config_upstream_runs_is_bitwise_upstream(
    tmp_path_factory: pytest.TempPathFactory, config: dict[str, object], frames: int
):
    theirs, folder = save(tmp_path_factory.mktemp("hifigan"), **config)
    x = mel(batch=1, frames=frames)
    with torch.no_grad():
        expected = theirs(x)
    assert torch.equal(load_vocoder(folder)(x), expected)


@pytest.mark.parametrize("shape", ["uneven"])
def test_bfloat16_is_bitwise_upstream_in_bfloat16(tmp_path: Path, shape: str):
    theirs, folder = save(tmp_path, **SHAPES[shape])
    ours = load_vocoder(folder, dtype=torch.bfloat16)
    x = mel()
    with torch.no_grad():
        expected = theirs.to(torch.bfloat16)(x.bfloat16())
    out = ours(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


def test_a_sharded_folder_loads_and_building_draws_nothing(tmp_path: Path):
    theirs, _ = save(tmp_path / "one")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    before = torch.random.get_rng_state()
    ours = load_vocoder(tmp_path / "sharded")
    assert torch.equal(torch.random.get_rng_state(), before)
    with torch.no_grad():
        assert torch.equal(ours(mel()), theirs(mel()))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("resblock_kernel_sizes", [3, 4, 11]),
        ("upsample_kernel_sizes", [8]),
        ("normalize_before", "yes"),
        ("upsample_rates", [0, 4]),
        ("upsample_kernel_sizes", [2, 8]),  # shorter than its rate of 4
        ("resblock_dilation_sizes", [[1, 3], [], [1]]),
        ("resblock_dilation_sizes", 3),
        ("leaky_relu_slope", "steep"),
    ],
)
def test_a_config_it_cannot_honour_is_engine_unavailable_naming_the_field(
    field: str, value: object
):
    config = SpeechT5HifiGanConfig(model_in_dim=MELS, upsample_initial_channel=16).to_dict()
    config[field] = value
    # Refused before any weight is looked at.
    with pytest.raises(EngineUnavailable, match=field):
        hifigan.build(config, {}, device="cpu", dtype=torch.float32)


def test_bad_mel_is_a_value_error_naming_the_argument(tmp_path: Path):
    ours = load_vocoder(save(tmp_path)[1])
    for bad in (
        torch.zeros(2, 3, MELS + 1),
        torch.zeros(1, 1, 3, MELS),
        torch.zeros(3, MELS).long(),
    ):
        with pytest.raises(ValueError, match="mel"):
            ours(bad)


def test_streamed_weights_give_the_resident_output_bitwise(tmp_path: Path):
    overrides = {**SHAPES["uneven"], "upsample_initial_channel": 64}
    ours = load_vocoder(save(tmp_path, **overrides)[1])
    x = mel()
    expected = ours(x)
    (handle,) = ours.handles
    slot = max(stage_bytes(p) for p in handle.unit_parts)
    budget = handle.base.nbytes + 2 * slot
    assert budget < handle.size_bytes
    rt = Runtime(simulate={"cpu": budget})
    rt.manager.register([handle], owner="hifigan@cpu")
    with HostCopies(handle.unit_parts) as copies, rt.manager.use(handle, working_bytes=0):
        out = ours(x)
    assert handle.streamed_bytes > 0 and copies.count > 0
    assert torch.equal(out, expected)


def test_threads_sharing_one_vocoder_get_the_same_output(tmp_path: Path):
    ours = load_vocoder(save(tmp_path)[1])
    inputs = [mel(seed=s) for s in range(2)]
    expected = [ours(x) for x in inputs]
    outs: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        outs[i] = ours(inputs[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(outs[i], expected[i]) for i in range(2))


@pytest.mark.cuda
def test_cuda_float32_matches_upstream_on_cuda(tmp_path: Path):
    theirs, folder = save(tmp_path, **SHAPES["uneven"])
    ours = load_vocoder(folder, device="cuda")
    x = mel().cuda()
    with torch.no_grad():
        expected = theirs.cuda()(x)
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
