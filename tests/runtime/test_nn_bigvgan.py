"""BigVGAN against a re-derived reference of NVIDIA/BigVGAN's forward, in the same process, bit
for bit.

The reference (``benchmarks/_ref_vocoders.py``, loaded by its path: one copy serves these tests
and the benchmark) is upstream's ``BigVGAN`` as plain ``torch.nn`` modules with upstream's names,
old-style weight norm and Kaiser-sinc filter buffers, randomly initialised (snake parameters too)
and saved as the Hub ships it: ``config.json`` without ``model_type`` and ``bigvgan_generator.pt``
(``{"generator": state_dict}``) or ``model.safetensors``. float32 and bfloat16 on the CPU are
compared with ``torch.equal`` (bfloat16: ours loaded with ``dtype=`` against the reference after
``.to(torch.bfloat16)``, the weight norm then computed in bfloat16 on both sides).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import HostCopies

from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import bigvgan, load_vocoder
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
MELS = 10
SHAPES = {
    "amp1-snakebeta-log-two-kernels": {
        "resblock_kernel_sizes": [3, 5],
        "resblock_dilation_sizes": [[1, 3], [2]],
    },
    "amp2-snake-linear": {"resblock": "2", "activation": "snake", "snake_logscale": False},
    "amp1-snake-log-v2-final": {
        "activation": "snake",
        "use_tanh_at_final": False,
        "use_bias_at_final": False,
    },
    "amp2-snakebeta-linear-three-stages": {
        "resblock": "2",
        "snake_logscale": False,
        "upsample_rates": [3, 2, 2],
        "upsample_kernel_sizes": [7, 4, 5],
        "resblock_dilation_sizes": [[1, 3, 5]],
        "use_bias_at_final": False,
    },
}


def save(directory: Path, seed: int = 0, safetensors: bool = False, **overrides: object):
    model = ref.make_bigvgan(ref.bigvgan_config(num_mels=MELS, **overrides), seed)
    return model, ref.save_bigvgan(model, directory, safetensors=safetensors)


def mel(batch: int = 2, frames: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, MELS, frames, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_is_bitwise_upstream_batched_unbatched_and_one_frame(tmp_path: Path, shape: str):
    theirs, folder = save(tmp_path, **SHAPES[shape])
    ours = load_vocoder(folder)
    x, one = mel(), mel(frames=1)
    with torch.no_grad():
        expected, expected_one = theirs(x)[:, 0], theirs(x[1:])[0, 0]
        expected_single = theirs(one)[:, 0]
    out = ours(x)
    assert torch.equal(out, expected)
    assert torch.equal(ours(x[1]), expected_one)
    assert torch.equal(ours(one), expected_single)
    # The final clamp (v2) or tanh is reached: the output is not all zeros.
    assert out.abs().max() > 1e-3


@st.composite
def configs(draw: st.DrawFn) -> dict[str, object]:
    """Layouts upstream runs: kernels at least their rates, odd residual kernels."""
    rates = draw(st.lists(st.integers(1, 3), min_size=1, max_size=2))
    blocks = draw(st.integers(1, 2))
    return {
        "resblock": draw(st.sampled_from(["1", "2"])),
        "activation": draw(st.sampled_from(["snake", "snakebeta"])),
        "snake_logscale": draw(st.booleans()),
        "use_tanh_at_final": draw(st.booleans()),
        "use_bias_at_final": draw(st.booleans()),
        "upsample_rates": rates,
        "upsample_kernel_sizes": [draw(st.integers(r, 2 * r + 1)) for r in rates],
        "upsample_initial_channel": draw(st.sampled_from([4, 8])),
        "resblock_kernel_sizes": draw(
            st.lists(st.sampled_from([1, 3, 5]), min_size=blocks, max_size=blocks)
        ),
        "resblock_dilation_sizes": [
            draw(st.lists(st.integers(1, 3), min_size=1, max_size=2)) for _ in range(blocks)
        ],
    }


@settings(
    max_examples=3,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(config=configs(), frames=st.integers(1, 9))
def test_any_config_upstream_runs_is_bitwise_upstream(
    tmp_path_factory: pytest.TempPathFactory, config: dict[str, object], frames: int
):
    theirs, folder = save(tmp_path_factory.mktemp("bigvgan"), **config)
    x = mel(batch=1, frames=frames)
    with torch.no_grad():
        expected = theirs(x)[:, 0]
    assert torch.equal(load_vocoder(folder)(x), expected)


def test_safetensors_and_weight_norm_removed_checkpoints_load(tmp_path: Path):
    theirs, folder = save(tmp_path / "st", safetensors=True, **SHAPES["amp2-snake-linear"])
    assert not (folder / "bigvgan_generator.pt").exists()
    x = mel()
    with torch.no_grad():
        expected = theirs(x)[:, 0]
    assert torch.equal(load_vocoder(folder)(x), expected)
    # Upstream loads a checkpoint saved after remove_weight_norm (plain ``weight``) as well.
    for module in theirs.modules():
        if hasattr(module, "weight_g"):
            torch.nn.utils.remove_weight_norm(module)
    plain = ref.save_bigvgan(theirs, tmp_path / "plain")
    assert not any(
        k.endswith("weight_g") for k in torch.load(plain / "bigvgan_generator.pt")["generator"]
    )
    with torch.no_grad():
        assert torch.equal(load_vocoder(plain)(x), theirs(x)[:, 0])


@pytest.mark.parametrize("shape", ["amp1-snakebeta-log", "amp2-snake-linear"])
def test_bfloat16_is_bitwise_upstream_in_bfloat16(tmp_path: Path, shape: str):
    theirs, folder = save(tmp_path, **SHAPES.get(shape, {}))
    ours = load_vocoder(folder, dtype=torch.bfloat16)
    x = mel()
    with torch.no_grad():
        exact = theirs(x)[:, 0]
        expected = theirs.to(torch.bfloat16)(x.bfloat16())[:, 0]
    out = ours(x)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)
    # bfloat16's own rounding (8 significant bits) through the stack: measured up to 3.2e-3 on
    # outputs up to 0.5; the bound leaves room for other kernels' summation orders.
    torch.testing.assert_close(out.float(), exact, rtol=0, atol=1e-2)


def test_building_draws_nothing_and_the_handle_is_named_after_the_folder(tmp_path: Path):
    _, folder = save(tmp_path)
    before = torch.random.get_rng_state()
    ours = load_vocoder(folder)
    assert torch.equal(torch.random.get_rng_state(), before)
    (handle,) = ours.handles
    assert handle.name == f"bigvgan@{folder.resolve()}:vocoder"
    assert ours.sample_rate == 8000 and ours.hop_length == 8


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("resblock", 1),  # upstream compares with the string "1"
        ("activation", "relu"),
        ("snake_logscale", "yes"),
        ("use_tanh_at_final", 0),
        ("upsample_kernel_sizes", [8]),
        ("upsample_kernel_sizes", [3, 4]),  # shorter than its rate of 4
        ("resblock_kernel_sizes", [3, 4]),
        ("resblock_dilation_sizes", [[1, 3], []]),
        ("upsample_initial_channel", 2),
        ("num_mels", None),
    ],
)
def test_a_config_it_cannot_build_is_engine_unavailable_naming_the_field(field: str, value):
    config = ref.bigvgan_config(num_mels=MELS)
    config[field] = value
    with pytest.raises(EngineUnavailable, match=field):
        bigvgan.build(config, {}, device="cpu", dtype=torch.float32)


def test_bad_mel_is_a_value_error_naming_the_argument(tmp_path: Path):
    ours = load_vocoder(save(tmp_path)[1])
    for bad in (
        torch.zeros(2, MELS + 1, 3),
        torch.zeros(1, 1, MELS, 3),
        torch.zeros(MELS, 3).long(),
        torch.zeros(MELS, 0),
    ):
        with pytest.raises(ValueError, match="mel"):
            ours(bad)


def test_streamed_weights_give_the_resident_output_bitwise(tmp_path: Path):
    ours = load_vocoder(save(tmp_path, upsample_initial_channel=64)[1])
    x = mel()
    expected = ours(x)
    (handle,) = ours.handles
    slot = max(stage_bytes(p) for p in handle.unit_parts)
    budget = handle.base.nbytes + 2 * slot
    assert budget < handle.size_bytes
    rt = Runtime(simulate={"cpu": budget})
    rt.manager.register([handle], owner="bigvgan@cpu")
    with HostCopies(handle.unit_parts) as copies, rt.manager.use(handle, working_bytes=0):
        out = ours(x)
    assert handle.streamed_bytes > 0 and copies.count > 0
    assert torch.equal(out, expected)


@pytest.mark.cuda
def test_cuda_float32_matches_upstream_on_cuda(tmp_path: Path):
    theirs, folder = save(tmp_path, **SHAPES["amp2-snakebeta-linear-three-stages"])
    ours = load_vocoder(folder, device="cuda")
    x = mel().cuda()
    with torch.no_grad():
        expected = theirs.cuda()(x)[:, 0]
    torch.testing.assert_close(ours(x), expected, rtol=0, atol=1e-5)
