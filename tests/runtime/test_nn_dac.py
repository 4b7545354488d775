"""DAC against transformers' DacModel in the same process, bit for bit.

Each checkpoint is a randomly initialised tiny DacModel (snake ``alpha`` drawn too, upstream starts
them at one) written with ``save_pretrained``, plain or with upstream's ``apply_weight_norm``; both
sides read the same folder. Codes from ``encode`` and audio from ``decode`` are compared with
``torch.equal`` in float32 and in bfloat16 (ours loaded with ``dtype=``, theirs ``.to()``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from small_models import HostCopies
from transformers import DacConfig, DacModel

from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import dac, load_codec
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import EngineUnavailable

SHAPES = {
    "small": {
        "encoder_hidden_size": 4,
        "downsampling_ratios": [2, 4],
        "decoder_hidden_size": 32,
        "n_codebooks": 3,
        "codebook_size": 16,
        "codebook_dim": 4,
    },
    "odd-strides": {
        "encoder_hidden_size": 2,
        "downsampling_ratios": [3, 2, 5],
        "decoder_hidden_size": 24,
        "n_codebooks": 4,
        "codebook_size": 8,
        "codebook_dim": 3,
    },
}


def save(
    directory: Path, shape: str = "small", weight_norm: bool = False, **overrides: object
) -> tuple[DacModel, Path]:
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = DacModel(DacConfig(**{**SHAPES[shape], **overrides})).eval()
        with torch.no_grad():
            for name, param in model.named_parameters():
                if name.endswith("alpha"):
                    param.uniform_(0.5, 2.0)
    if weight_norm:
        model.apply_weight_norm()
    model.save_pretrained(directory)
    return model, directory


def audio(batch: int = 2, samples: int = 331, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 1, samples, generator=torch.Generator().manual_seed(seed))


def upstream(model: DacModel, x: torch.Tensor, n_quantizers: int | None = None):
    with torch.no_grad():
        codes = model.encode(x, n_quantizers=n_quantizers).audio_codes
        return codes, model.decode(audio_codes=codes).audio_values


@pytest.mark.parametrize(
    ("shape", "weight_norm"),
    [("small", False), ("odd-strides", True)],
    ids=["small-plain", "odd-strides-weight-norm"],
)
def test_float32_codes_and_audio_are_bitwise_upstream(
    tmp_path: Path, shape: str, weight_norm: bool
):
    theirs, folder = save(tmp_path, shape, weight_norm)
    ours = load_codec(folder)
    x = audio()
    codes, expected = upstream(theirs, x)
    assert torch.equal(ours.encode(x), codes)
    assert torch.equal(ours.decode(codes), expected.unsqueeze(1))
    fewer, fewer_audio = upstream(theirs, x, n_quantizers=2)
    assert torch.equal(ours.encode(x, n_quantizers=2), fewer)
    assert torch.equal(ours.decode(fewer), fewer_audio.unsqueeze(1))


@settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    strides=st.lists(st.integers(1, 5), min_size=1, max_size=3),
    books=st.integers(1, 3),
    size=st.sampled_from([2, 8]),
    dim=st.integers(1, 4),
    weight_norm=st.booleans(),
    up=st.none() | st.lists(st.integers(1, 4), min_size=1, max_size=2),
    extra=st.sampled_from([0, 1, 29]),
)
def test_any_config_is_bitwise_upstream(
    tmp_path_factory: pytest.TempPathFactory,
    strides: list[int],
    books: int,
    size: int,
    dim: int,
    weight_norm: bool,
    up: list[int] | None,
    extra: int,
):
    """``up``: decoder strides stored in the config (else the encoder's reversed). ``extra``:
    samples over the fewest the strides take; 0 leaves one frame, where a length-1 time axis
    lets torch pick conv kernels by strides that upstream's ops decide."""
    fields: dict[str, object] = {
        "encoder_hidden_size": 2,
        "downsampling_ratios": strides,
        "decoder_hidden_size": 16,
        "n_codebooks": books,
        "codebook_size": size,
        "codebook_dim": dim,
    }
    if up is not None:
        fields["upsampling_ratios"] = up
    theirs, folder = save(tmp_path_factory.mktemp("dac"), "small", weight_norm, **fields)
    ours = load_codec(folder)
    config = ours.config
    samples = config.shortest_audio + extra + (config.shortest_codes - 1) * config.hop_length
    x = audio(batch=2, samples=samples)
    codes, expected = upstream(theirs, x)
    assert torch.equal(ours.encode(x), codes)
    assert torch.equal(ours.decode(codes), expected.unsqueeze(1))


def test_bfloat16_is_bitwise_upstream_in_bfloat16(tmp_path: Path):
    theirs, folder = save(tmp_path, "odd-strides", weight_norm=True)
    ours = load_codec(folder, dtype=torch.bfloat16)
    x = audio()
    codes, expected = upstream(theirs.to(torch.bfloat16), x.bfloat16())
    assert torch.equal(ours.encode(x), codes)
    out = ours.decode(codes)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected.unsqueeze(1))


def test_a_sharded_folder_loads_and_building_draws_nothing(tmp_path: Path):
    theirs, _ = save(tmp_path / "one")
    theirs.save_pretrained(tmp_path / "sharded", max_shard_size="10KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").exists()
    before = torch.random.get_rng_state()
    ours = load_codec(tmp_path / "sharded")
    assert torch.equal(torch.random.get_rng_state(), before)
    codes, _ = upstream(theirs, audio())
    assert torch.equal(ours.encode(audio()), codes)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("codebook_size", 12),
        ("decoder_hidden_size", 2),
        ("downsampling_ratios", []),
        ("codebook_dim", 0),
    ],
)
def test_a_config_it_cannot_honour_is_engine_unavailable_naming_the_field(
    field: str, value: object
):
    config = DacConfig(**SHAPES["small"]).to_dict()
    config[field] = value
    # Refused before any weight is looked at.
    with pytest.raises(EngineUnavailable, match=field):
        dac.build(config, {}, device="cpu", dtype=torch.float32)


def test_bad_input_is_a_value_error_naming_the_argument(tmp_path: Path):
    ours = load_codec(save(tmp_path)[1])
    short = torch.zeros(1, 1, 7)  # the 2 then 4 strides leave no frame below 8 samples
    for bad in (torch.zeros(2, 100), torch.zeros(1, 2, 100), torch.zeros(1, 1, 100).long(), short):
        with pytest.raises(ValueError, match="audio"):
            ours.encode(bad)
    with pytest.raises(ValueError, match="n_quantizers"):
        ours.encode(audio(), n_quantizers=4)
    good = torch.zeros(1, 3, 5, dtype=torch.long)
    for bad in (good.float(), good[:, :, None], torch.zeros(1, 4, 5).long(), good + 16, good - 1):
        with pytest.raises(ValueError, match="codes"):
            ours.decode(bad)
    # Each stride-1 decoder block shortens the audio by one sample: two need three frames.
    shrinking = load_codec(save(tmp_path / "shrinking", upsampling_ratios=[1, 1])[1])
    with pytest.raises(ValueError, match="codes: expected at least 3 frames"):
        shrinking.decode(good[..., :2])


def streaming(handles: tuple[ModelHandle, ...], streamed: ModelHandle) -> Runtime:
    """A simulated device with room for the bases and one staging slot of ``streamed``'s
    largest block: each block is four times the one before, so two slots would hold them all."""
    slot = max(stage_bytes(p) for p in streamed.unit_parts)
    budget = sum(h.base.nbytes for h in handles) + slot
    assert budget < sum(h.size_bytes for h in handles)
    rt = Runtime(simulate={"cpu": budget}, settings={"compute.stream_in_flight": 1})
    rt.manager.register(handles, owner="dac@cpu")
    return rt


def test_streamed_blocks_give_the_resident_codes_and_audio_bitwise(tmp_path: Path):
    folder = save(tmp_path, encoder_hidden_size=8, decoder_hidden_size=64)[1]
    for_encode, for_decode = load_codec(folder), load_codec(folder)
    x = audio()
    codes = for_encode.encode(x)
    expected = for_decode.decode(codes)
    encoder, quantizer, _ = for_encode.handles
    rt = streaming((encoder, quantizer), encoder)
    with HostCopies(encoder.unit_parts) as copies, rt.manager.use(encoder, quantizer):
        assert torch.equal(for_encode.encode(x), codes)
    assert copies.count > 0 and encoder.streamed_bytes > 0
    _, quantizer, decoder = for_decode.handles
    rt = streaming((quantizer, decoder), decoder)
    with HostCopies(decoder.unit_parts) as copies, rt.manager.use(quantizer, decoder):
        assert torch.equal(for_decode.decode(codes), expected)
    assert copies.count > 0 and decoder.streamed_bytes > 0


def test_threads_sharing_one_codec_get_the_same_output(tmp_path: Path):
    ours = load_codec(save(tmp_path)[1])
    inputs = [audio(seed=s) for s in range(2)]
    expected = [ours.decode(ours.encode(x)) for x in inputs]
    outs: dict[int, torch.Tensor] = {}

    def work(i: int) -> None:
        outs[i] = ours.decode(ours.encode(inputs[i]))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(outs[i], expected[i]) for i in range(2))


@pytest.mark.cuda
def test_cuda_matches_upstream_on_cuda(tmp_path: Path):
    theirs, folder = save(tmp_path, "odd-strides")
    ours = load_codec(folder, device="cuda")
    x = audio().cuda()
    codes, expected = upstream(theirs.cuda(), x)
    assert torch.equal(ours.encode(x), codes)
    torch.testing.assert_close(ours.decode(codes), expected.unsqueeze(1), rtol=0, atol=1e-5)
