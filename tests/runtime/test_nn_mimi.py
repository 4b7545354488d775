"""Mimi against transformers 5.24's MimiModel in the same process.

Every checkpoint is a tiny randomly initialised MimiModel (codebook sums drawn normal and usages
uniform, since upstream initialises them to zeros and ones) written with ``save_pretrained``; both
sides load the same folder. float32 codes and audio must be identical (``torch.equal``); bfloat16
decode must equal transformers' own bfloat16 decode too.
"""

from __future__ import annotations

import itertools
import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from small_models import HostCopies
from transformers import MimiConfig, MimiModel

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.nn import load_codec
from mizuoto_runtime.runtime import Runtime
from mizuoto_sdk.errors import EngineUnavailable

SHAPES = {
    # 40 encoder frames over a window of 5: the banded mask path; one kv head per two heads
    "window-gqa": {},
    # the window longer than the sequence: sdpa's causal flag; plain multi-head
    "long-window-mha-cache": {"sliding_window": 100, "num_key_value_heads": 2, "use_cache": True},
    "noncausal-reflect-shortcut": {
        "use_causal_conv": False,
        "pad_mode": "reflect",
        "use_conv_shortcut": True,
    },
    "stereo-no-projection-hub-frame-rate": {
        "audio_channels": 2,
        "vector_quantization_hidden_dimension": 16,
        "codebook_dim": 16,
        "frame_rate": 100,  # spelled out as Hub configs do (upstream needs resampling: != 200)
        "num_semantic_quantizers": 2,
        "hidden_act": "gelu_pytorch_tanh",
        "num_residual_layers": 2,
    },
}


def save_checkpoint(directory: Path, seed: int = 0, **overrides: object) -> MimiModel:
    fields: dict[str, object] = {
        "hidden_size": 16,
        "num_filters": 4,
        "upsampling_ratios": [2, 3],
        "sampling_rate": 1200,
        "codebook_size": 16,
        "codebook_dim": 8,
        "vector_quantization_hidden_dimension": 8,
        "num_quantizers": 4,
        "num_semantic_quantizers": 1,
        "upsample_groups": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 24,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "sliding_window": 5,
    }
    fields.update(overrides)
    frame_rate = fields.pop("frame_rate", None)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = MimiModel(
            MimiConfig(**fields, **({"frame_rate": frame_rate} if frame_rate else {}))
        )
        with torch.no_grad():
            for name, buffer in model.named_buffers():
                if name.endswith("embed_sum"):
                    buffer.normal_()
                elif name.endswith("cluster_usage"):
                    buffer.uniform_(0.5, 2.0)
    model.save_pretrained(directory, max_shard_size="40KB")
    if frame_rate:  # as Hub configs spell it
        config = json.loads((directory / "config.json").read_text())
        config["frame_rate"] = frame_rate
        (directory / "config.json").write_text(json.dumps(config))
    return model.eval()


def audio(channels: int = 1, length: int = 240, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, channels, length, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shape", SHAPES)
def test_float32_encode_and_decode_are_bitwise_upstream(tmp_path: Path, shape: str):
    theirs = save_checkpoint(tmp_path, **SHAPES[shape])
    ours = load_codec(tmp_path)
    x = audio(theirs.config.audio_channels)
    with torch.no_grad():
        for count in (None, theirs.config.num_semantic_quantizers + 1):
            expected = theirs.encode(x, num_quantizers=count).audio_codes
            codes = ours.encode(x, num_quantizers=count)
            assert torch.equal(codes, expected)
            assert torch.equal(ours.decode(codes), theirs.decode(expected).audio_values)


@pytest.mark.parametrize("shape", ["window-gqa", "long-window-mha-cache"])
def test_stream_decoder_chunks_join_to_the_whole_decode(tmp_path: Path, shape: str):
    save_checkpoint(tmp_path, **SHAPES[shape])
    codec = load_codec(tmp_path)
    codes = codec.encode(audio(length=360))
    whole = codec.decode(codes)
    for cuts in ((0, 1, 2, 7, 8, 30),):
        stream = codec.stream_decoder()
        joined = torch.cat(
            [stream.decode(codes[..., a:b]) for a, b in itertools.pairwise(cuts)], -1
        )
        assert joined.shape == whole.shape
        torch.testing.assert_close(joined, whole, rtol=0, atol=1e-5)


def test_stream_decoder_is_refused_where_the_decoder_is_not_causal(tmp_path: Path):
    save_checkpoint(tmp_path, use_causal_conv=False)
    with pytest.raises(EngineUnavailable, match="use_causal_conv"):
        load_codec(tmp_path).stream_decoder()


def test_bfloat16_decode_is_bitwise_upstreams_bfloat16(tmp_path: Path):
    theirs = save_checkpoint(tmp_path)
    codes = load_codec(tmp_path).encode(audio())
    with torch.no_grad():
        reference = theirs.decode(codes).audio_values
        upstream = MimiModel.from_pretrained(tmp_path, dtype=torch.bfloat16).eval()
        theirs_bf16 = upstream.decode(codes).audio_values.float()
        theirs_codes = upstream.encode(audio().bfloat16()).audio_codes
    ours = load_codec(tmp_path, dtype=torch.bfloat16)
    ours_bf16 = ours.decode(codes).float()
    assert torch.equal(ours_bf16, theirs_bf16)  # the same bfloat16 operations in the same order
    assert 0 < (ours_bf16 - reference).abs().max() < 0.05 * reference.abs().max()
    assert torch.equal(ours.encode(audio()), theirs_codes)


def test_streamed_transformer_layers_and_blocks_on_a_small_device_are_bitwise(tmp_path: Path):
    save_checkpoint(tmp_path)
    codec = load_codec(tmp_path)
    x = audio()
    expected = codec.encode(x)
    expected_audio = codec.decode(expected)
    encoder, decoder, quantizer = codec.handles
    units = [*encoder.unit_parts, *decoder.unit_parts]
    slots = 2 * max(stage_bytes(p) for p in units)
    budget = sum(h.base.nbytes for h in codec.handles) + quantizer.size_bytes + slots + 4096
    runtime = Runtime(simulate={"cpu": budget})
    runtime.manager.register(codec.handles, owner="mimi@cpu")
    context = RequestContext(manager=runtime.manager)

    def both() -> tuple[torch.Tensor, torch.Tensor]:
        codes = codec.encode(x)
        return codes, codec.decode(codes)

    with HostCopies(units) as copies, context.bind():
        codes, decoded = context.run("codec", both, handles=codec.handles, working_bytes=0)
    assert encoder.streamed_bytes > 0 and decoder.streamed_bytes > 0 and copies.count > 0
    assert torch.equal(codes, expected) and torch.equal(decoded, expected_audio)


def test_threads_coding_at_once_each_get_the_single_threaded_result(tmp_path: Path):
    save_checkpoint(tmp_path)
    codec = load_codec(tmp_path)
    inputs = [audio(length=120, seed=seed) for seed in range(3)]
    expected = [codec.decode(codec.encode(x)) for x in inputs]

    def both(x: torch.Tensor) -> torch.Tensor:
        codes = codec.encode(x)
        stream = codec.stream_decoder()
        return torch.cat([stream.decode(codes[..., :4]), stream.decode(codes[..., 4:])], -1)

    with ThreadPoolExecutor(3) as pool:
        got = list(pool.map(both, inputs))
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_loading_and_coding_draw_nothing_from_the_global_generator(tmp_path: Path):
    save_checkpoint(tmp_path)
    before = torch.random.get_rng_state()
    codec = load_codec(tmp_path)
    codec.stream_decoder().decode(codec.encode(audio()))
    assert torch.equal(torch.random.get_rng_state(), before)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("hidden_act", "swish_glu"),
        ("rope_parameters", {"rope_type": "linear", "factor": 2.0}),
        ("use_streaming", True),
    ],
)
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
        codec.encode(torch.zeros(1, 240))
    with pytest.raises(ValueError, match="num_quantizers"):
        codec.encode(torch.zeros(1, 1, 240), num_quantizers=5)
    with pytest.raises(ValueError, match="codes"):
        codec.decode(torch.full((1, 2, 5), 16))
    with pytest.raises(ValueError, match="codes"):
        codec.decode(torch.zeros(1, 5, 5, dtype=torch.long))


@pytest.mark.cuda
def test_cuda_decode_is_close_to_upstream_on_cuda(tmp_path: Path):
    theirs = save_checkpoint(tmp_path).to("cuda")
    codec = load_codec(tmp_path, device="cuda")
    x = audio().cuda()
    with torch.no_grad():
        codes = theirs.encode(x).audio_codes
        expected = theirs.decode(codes).audio_values
    torch.testing.assert_close(codec.decode(codes), expected, rtol=0, atol=1e-5)


def test_handles_are_named_after_the_folder_or_the_name_given(tmp_path: Path):
    save_checkpoint(tmp_path)
    parts = ("encoder", "decoder", "quantizer")
    default = [h.name for h in load_codec(tmp_path).handles]
    assert default == [f"mimi@{tmp_path.resolve()}:{part}" for part in parts]
    assert [h.name for h in load_codec(tmp_path, name="csm/tiny").handles] == [
        f"csm/tiny:{part}" for part in parts
    ]
