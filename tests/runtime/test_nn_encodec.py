"""EnCodec against transformers 5.24's EncodecModel in the same process.

Every checkpoint is a tiny randomly initialised EncodecModel (its codebooks filled with normal
draws, since upstream initialises them to zeros) written with ``save_pretrained``; both sides load
the same folder. float32 codes and audio must be identical (``torch.equal``); bfloat16 decode must
equal transformers' own bfloat16 decode too.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
import torch
from small_models import HostCopies
from transformers import EncodecConfig, EncodecModel

from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import load_codec
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import EngineUnavailable

SHAPES = {
    "causal-weightnorm-lstm1": {},
    "noncausal-weightnorm": {"use_causal_conv": False, "num_lstm_layers": 2},
    "causal-groupnorm-stereo": {"norm_type": "time_group_norm", "audio_channels": 2},
    "lstm2-stereo-dilated": {
        "num_lstm_layers": 2,
        "audio_channels": 2,
        "num_residual_layers": 2,
        "use_conv_shortcut": False,
        "pad_mode": "constant",
    },
    "odd-kernels-trim": {
        "upsampling_ratios": [3, 2],
        "kernel_size": 5,
        "last_kernel_size": 3,
        "compress": 1,
        "trim_right_ratio": 0.5,
    },
}


def save_checkpoint(directory: Path, seed: int = 0, **overrides: object) -> EncodecModel:
    fields: dict[str, object] = {
        "num_filters": 4,
        "hidden_size": 8,
        "upsampling_ratios": [2, 3],
        "codebook_size": 16,
        "num_lstm_layers": 1,
        "sampling_rate": 600,  # 100 frames a second: 400 bit/s per 16-entry codebook
        "target_bandwidths": [0.8, 1.6],
    }
    fields.update(overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = EncodecModel(EncodecConfig(**fields))
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name.endswith("codebook.embed"):
                    buffer.normal_()
    model.save_pretrained(directory, max_shard_size="20KB")  # sharded: the index is read too
    return model.eval()


def audio(channels: int, length: int = 97, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, channels, length, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_encode_and_decode_are_bitwise_upstream(tmp_path: Path, shape: str):
    theirs = save_checkpoint(tmp_path, **SHAPES[shape])
    ours = load_codec(tmp_path)
    x = audio(theirs.config.audio_channels)
    with torch.no_grad():
        for bandwidth in (None, 1.6):
            expected = theirs.encode(x, bandwidth=bandwidth).audio_codes
            codes = ours.encode(x, bandwidth=bandwidth)
            assert torch.equal(codes, expected[0])
            decoded = theirs.decode(expected, [None]).audio_values
            assert torch.equal(ours.decode(codes), decoded)
            assert torch.equal(ours.decode(expected), decoded)  # upstream's 4-D layout too


@pytest.mark.parametrize(
    "overrides",
    [
        {"normalize": True},
        # 60-sample chunks every 54 (as the 48 kHz checkpoint: 1 s chunks, 1% overlap, rescaled)
        {"normalize": True, "chunk_length_s": 0.1, "overlap": 0.1, "audio_channels": 2},
    ],
    ids=["normalized", "chunked-normalized-stereo"],
)
def test_chunked_and_normalized_checkpoints_code_as_upstream_through_frames(
    tmp_path: Path, overrides: dict[str, object]
):
    theirs = save_checkpoint(tmp_path, **overrides)
    ours = load_codec(tmp_path)
    x = audio(theirs.config.audio_channels, 197)
    with torch.no_grad():
        expected = theirs.encode(x, bandwidth=1.6)
        decoded = theirs.decode(
            expected.audio_codes,
            expected.audio_scales,
            last_frame_pad_length=expected.last_frame_pad_length,
        ).audio_values
    frames = ours.encode_frames(x, bandwidth=1.6)
    assert torch.equal(frames.codes, expected.audio_codes)
    assert frames.last_frame_pad_length == expected.last_frame_pad_length
    assert all(torch.equal(a, b) for a, b in zip(frames.scales, expected.audio_scales, strict=True))
    assert torch.equal(ours.decode_frames(frames), decoded)
    with pytest.raises(ValueError, match="encode_frames"):
        ours.encode(x)
    with pytest.raises(EngineUnavailable, match="normalize"):
        ours.stream_decoder()


@pytest.mark.parametrize("shape", ["causal-weightnorm-lstm1", "lstm2-stereo-dilated"])
def test_stream_decoder_chunks_join_to_the_whole_decode(tmp_path: Path, shape: str):
    save_checkpoint(tmp_path, **SHAPES[shape])
    codec = load_codec(tmp_path)
    codes = codec.encode(audio(codec.channels, 200), bandwidth=1.6)
    whole = codec.decode(codes)
    stream = codec.stream_decoder()
    cuts = (0, 1, 2, 9, 10, 23, 34)
    parts = [stream.decode(codes[..., a:b]) for a, b in itertools.pairwise(cuts)]
    # reflect padding holds the first frames back until the first conv's kernel is full
    assert parts[0].shape[-1] == (0 if stream.warmup > 1 else codec.hop_length)
    joined = torch.cat(parts, dim=-1)
    assert joined.shape == whole.shape
    torch.testing.assert_close(joined, whole, rtol=0, atol=1e-5)


def test_stream_decoder_is_refused_where_the_decoder_is_not_causal(tmp_path: Path):
    save_checkpoint(tmp_path, norm_type="time_group_norm")
    with pytest.raises(EngineUnavailable, match="time_group_norm"):
        load_codec(tmp_path).stream_decoder()


def test_bfloat16_decode_is_bitwise_upstreams_bfloat16(tmp_path: Path):
    theirs = save_checkpoint(tmp_path, num_lstm_layers=2)
    codes = load_codec(tmp_path).encode(audio(1), bandwidth=1.6)
    with torch.no_grad():
        reference = theirs.decode(codes[None], [None]).audio_values
        upstream = EncodecModel.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
        theirs_bf16 = upstream.decode(codes[None], [None]).audio_values.float()
        theirs_codes = upstream.encode(audio(1).bfloat16(), bandwidth=1.6).audio_codes[0]
    ours = load_codec(tmp_path, dtype=torch.bfloat16)
    ours_bf16 = ours.decode(codes).float()
    assert torch.equal(ours_bf16, theirs_bf16)  # the same bfloat16 operations in the same order
    assert 0 < (ours_bf16 - reference).abs().max() < 0.05 * reference.abs().max()
    assert torch.equal(ours.encode(audio(1), bandwidth=1.6), theirs_codes)


def test_decode_with_streamed_blocks_on_a_small_device_is_bitwise(tmp_path: Path):
    save_checkpoint(tmp_path, num_residual_layers=2)
    codec = load_codec(tmp_path)
    x = audio(1)
    codes = codec.encode(x, bandwidth=1.6)
    expected = codec.decode(codes), codec.encode(x, bandwidth=1.6)
    encoder, decoder, quantizer = codec.handles
    units = [*encoder.unit_parts, *decoder.unit_parts]
    slots = 2 * max(stage_bytes(p) for p in units)
    budget = sum(h.base.nbytes for h in codec.handles) + quantizer.size_bytes + slots + 4096
    runtime = Runtime(simulate={"cpu": budget})
    runtime.manager.register(codec.handles, owner="encodec@cpu")
    with HostCopies(units) as copies, runtime.manager.use(*codec.handles, working_bytes=0):
        got = codec.decode(codes), codec.encode(x, bandwidth=1.6)
    assert decoder.streamed_bytes > 0 and copies.count > 0
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_loading_draws_nothing_from_the_global_generator(tmp_path: Path):
    save_checkpoint(tmp_path)
    before = torch.random.get_rng_state()
    codec = load_codec(tmp_path)
    codec.decode(codec.encode(audio(1)))
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize(("field", "value"), [("chunk_length_s", 1.0), ("norm_type", "batch")])
def test_a_config_this_port_does_not_follow_is_refused_by_name(
    tmp_path: Path, field: str, value: object
):
    save_checkpoint(tmp_path)
    fields = json.loads((tmp_path / "config.json").read_text())
    fields[field] = value
    (tmp_path / "config.json").write_text(json.dumps(fields))
    with pytest.raises(EngineUnavailable, match=field):
        load_codec(tmp_path)


def test_bad_input_names_the_argument(tmp_path: Path):
    save_checkpoint(tmp_path)
    codec = load_codec(tmp_path)
    with pytest.raises(ValueError, match="audio"):
        codec.encode(torch.zeros(1, 97))
    with pytest.raises(ValueError, match="audio"):
        codec.encode(torch.zeros(1, 2, 97))
    with pytest.raises(ValueError, match="bandwidth"):
        codec.encode(torch.zeros(1, 1, 97), bandwidth=3.0)
    with pytest.raises(ValueError, match="codes"):
        codec.decode(torch.full((1, 2, 5), 16))
    with pytest.raises(ValueError, match="codes"):
        codec.decode(torch.zeros(1, 5, 5, dtype=torch.long))


@pytest.mark.cuda
def test_cuda_decode_is_close_to_upstream_on_cuda(tmp_path: Path):
    theirs = save_checkpoint(tmp_path).to("cuda")
    codec = load_codec(tmp_path, device="cuda")
    x = audio(1).cuda()
    with torch.no_grad():
        codes = theirs.encode(x, bandwidth=1.6).audio_codes
        expected = theirs.decode(codes, [None]).audio_values
    torch.testing.assert_close(codec.decode(codes[0]), expected, rtol=0, atol=1e-5)
