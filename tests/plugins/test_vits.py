"""The vits engine against transformers' VitsModel in the same process, bit for bit.

Every checkpoint is a small random VitsModel written by the package's ``make_weights.write``
(transformers' ``save_pretrained``); both sides read the same folder. Upstream runs after
``torch.manual_seed(seed)`` inside ``fork_rng``; the engine gets the seed as a request param and
draws from the request's generator. float32 on the CPU, compared with ``torch.equal``.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer, VitsModel

from mizuoto_engine_vits.engine import VitsEngine
from mizuoto_engine_vits.make_weights import WEIGHTS_DIR, write
from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.runtime import Runtime
from mizuoto_runtime.weights.loading import LoadError
from mizuoto_sdk import EngineError, LoadSpec
from mizuoto_sdk.errors import EngineUnavailable
from mizuoto_sdk.host import EngineRequest, RuntimeService

TEXT = "Hi there, Kim."
FAST = {"upsample_initial_channel": 16, "upsample_rates": [4, 2], "upsample_kernel_sizes": [8, 4]}
"""A decoder of hop 8 instead of the shipped 256: the parity tests spend their time on the
flows and predictors, which differ between configs, rather than on long waveforms."""
SPEAKERS = {"speakers": 3, "speakers-plain": 2}
CONFIGS: dict[str, dict[str, Any] | None] = {
    "shipped": None,
    "plain-durations": {**FAST, "use_stochastic_duration_prediction": False},
    "wide": {
        "hidden_size": 24,
        "num_attention_heads": 4,
        "window_size": 2,
        "ffn_kernel_size": 1,
        "hidden_act": "gelu",
        "flow_size": 8,
        "prior_encoder_num_flows": 3,
        "prior_encoder_num_wavenet_layers": 3,
        "wavenet_dilation_rate": 2,
        "wavenet_kernel_size": 3,
        "upsample_initial_channel": 8,
        "upsample_rates": [3, 2],
        "upsample_kernel_sizes": [5, 4],
        "resblock_kernel_sizes": [3],
        "resblock_dilation_sizes": [[1, 2, 3]],
        "duration_predictor_num_flows": 3,
        "duration_predictor_flow_bins": 6,
        "duration_predictor_tail_bound": 4.0,
        "depth_separable_num_layers": 1,
        "speaking_rate": 1.3,
        "noise_scale": 0.5,
        "noise_scale_duration": 0.6,
    },
    "narrow-window": {**FAST, "window_size": 1, "num_hidden_layers": 1, "use_bias": False},
    "speakers": {**FAST, "num_speakers": SPEAKERS["speakers"], "speaker_embedding_size": 6},
    "speakers-plain": {
        **FAST,
        "num_speakers": SPEAKERS["speakers-plain"],
        "speaker_embedding_size": 4,
        "use_stochastic_duration_prediction": False,
    },
}


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vits")
    return {
        name: WEIGHTS_DIR if changes is None else write(root / name, seed=i, overrides=changes)
        for i, (name, changes) in enumerate(CONFIGS.items())
    }


@pytest.fixture(scope="module")
def upstream(folders):
    return {
        name: (VitsModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder))
        for name, folder in folders.items()
    }


@pytest.fixture(scope="module")
def engines(folders):
    return {
        name: VitsEngine().load(
            LoadSpec(name, "cpu", "float32", model_dir=folder), Runtime(), RequestContext(seed=0)
        )
        for name, folder in folders.items()
    }


@pytest.fixture(scope="module")
def host() -> RuntimeService:
    return RuntimeService()


def theirs(
    pair: Any,
    texts: list[str],
    seed: int,
    *,
    speaking_rate: float | None = None,
    noise_scale: float | None = None,
    noise_scale_duration: float | None = None,
    speaker: int | None = None,
) -> list[torch.Tensor]:
    """Upstream's waveform for each text, one after the other after one manual_seed."""
    model, tokenizer = pair
    saved = model.noise_scale, model.noise_scale_duration
    model.noise_scale = saved[0] if noise_scale is None else noise_scale
    model.noise_scale_duration = saved[1] if noise_scale_duration is None else noise_scale_duration
    try:
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(seed)
            return [
                model(
                    **tokenizer(text, return_tensors="pt"),
                    speaking_rate=speaking_rate,
                    speaker_id=speaker,
                ).waveform[0]
                for text in texts
            ]
    finally:
        model.noise_scale, model.noise_scale_duration = saved


def ours(
    loaded: Any, text: str, seed: int, progress: Any = None, **params: Any
) -> list[torch.Tensor]:
    given = {k: v for k, v in params.items() if v is not None}
    ctx = RequestContext(seed=seed, params=given, progress=progress)
    with torch.inference_mode():
        return [torch.from_numpy(c.samples) for c in loaded.synthesize(text, given, ctx)]


CONTROLS = [
    {},
    {"speaking_rate": 0.7, "noise_scale": 1.2, "noise_scale_duration": 1.5},
    {"speaking_rate": 1.6, "noise_scale": 0.0, "noise_scale_duration": 0.0},
]


@pytest.mark.parametrize("name", ["plain-durations", "wide", "narrow-window"])
@pytest.mark.parametrize("controls", CONTROLS, ids=["defaults", "slow-noisy", "fast-no-noise"])
def test_one_sentence_is_upstreams_waveform(upstream, engines, name, controls):
    seed = 7 * len(controls)
    [want] = theirs(upstream[name], [TEXT], seed, **controls)
    [got] = ours(engines[name], TEXT, seed, **controls)
    assert torch.equal(got, want), (name, seed, controls)


@pytest.mark.parametrize("name", ["speakers", "speakers-plain"])
def test_each_speaker_is_upstreams_and_differs(upstream, engines, name):
    takes = []
    for speaker in (None, *range(SPEAKERS[name])):
        [want] = theirs(upstream[name], [TEXT], 3, speaker=speaker)
        [got] = ours(engines[name], TEXT, 3, speaker=speaker)
        assert torch.equal(got, want), speaker
        takes.append(got)
    assert not torch.equal(takes[1], takes[2])


def test_sentences_stream_as_upstream_runs_them_in_order(upstream, engines):
    """One generator across the sentences: chunk i is upstream's waveform for sentence i when
    upstream runs the sentences one after the other after a single manual_seed."""
    sentences = ["First one. ", "A second? ", "Yes!"]
    seen: list[tuple[float, float | None]] = []
    loaded = engines["narrow-window"]
    ctx = RequestContext(seed=11, progress=lambda done, total, message: seen.append((done, total)))
    with torch.inference_mode():
        stream = loaded.synthesize("".join(sentences), {}, ctx)
        first = next(stream)
        assert seen == [(1, 3)]  # the first chunk came after one sentence's work
        rest = list(stream)
    wants = theirs(upstream["narrow-window"], sentences, 11)
    got = [torch.from_numpy(c.samples) for c in (first, *rest)]
    assert len(got) == 3
    assert all(torch.equal(g, w) for g, w in zip(got, wants, strict=True))


def test_a_one_frame_utterance_is_upstreams(tmp_path):
    """One id, spoken fast, is one latent frame; a rate-1 upsampler keeps a one-step time axis,
    whose strides torch may read either way (the decoder's in-place steps must not change them)."""
    changes = {**FAST, "upsample_rates": [1, 2], "upsample_kernel_sizes": [3, 4]}
    folder = write(tmp_path, seed=9, overrides=changes, tokenizer={"add_blank": False})
    pair = (VitsModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder))
    loaded = VitsEngine().load(
        LoadSpec("tiny", "cpu", "float32", model_dir=folder), Runtime(), RequestContext(seed=0)
    )
    for seed in range(3):
        [want] = theirs(pair, ["a"], seed, speaking_rate=100.0)
        [got] = ours(loaded, "a", seed, speaking_rate=100.0)
        assert got.numel() == 2 and torch.equal(got, want)


def test_sentences_without_a_vocabulary_character_are_skipped(engines):
    chunks = ours(engines["wide"], "Well. 123. Done", 5)
    assert len(chunks) == 2


def test_through_the_host_the_seed_gives_upstreams_audio(host, upstream):
    handle = host.load("vits")
    request = EngineRequest(params={"seed": 21, "speaking_rate": 1.2})
    samples = np.concatenate([c.samples for c in handle.synthesize(TEXT, request)])
    [want] = theirs(upstream["shipped"], [TEXT], 21, speaking_rate=1.2)
    assert np.array_equal(samples, want.numpy())
    assert request.applied["vits"]["speaking_rate"] == 1.2
    assert handle.description["sample_rate"] == 16_000


def test_a_local_folder_stands_in_for_the_model(upstream, folders):
    service = RuntimeService()
    service.settings.set("engines.vits.model_dir", str(folders["speakers"]))
    handle = service.load("vits")
    request = EngineRequest(params={"seed": 2, "speaker": 1})
    samples = np.concatenate([c.samples for c in handle.synthesize(TEXT, request)])
    [want] = theirs(upstream["speakers"], [TEXT], 2, speaker=1)
    assert np.array_equal(samples, want.numpy())
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize(TEXT, EngineRequest(params={"seed": 2, "speaker": 3})))
    assert caught.value.detail["field"] == "params.speaker"


def test_hub_weight_norm_names_load_to_the_same_audio(folders, engines, tmp_path):
    """The Hub's MMS-TTS files name weight-norm halves weight_g / weight_v."""
    source = folders["wide"]
    for name in ("config.json", "vocab.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((source / name).read_bytes())
    old = {
        k.replace(".parametrizations.weight.original0", ".weight_g").replace(
            ".parametrizations.weight.original1", ".weight_v"
        ): v
        for k, v in load_file(source / "model.safetensors").items()
    }
    save_file(old, tmp_path / "model.safetensors")
    loaded = VitsEngine().load(
        LoadSpec("tiny", "cpu", "float32", model_dir=tmp_path), Runtime(), RequestContext(seed=0)
    )
    assert torch.equal(ours(loaded, TEXT, 4)[0], ours(engines["wide"], TEXT, 4)[0])


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"speaking_rate": 0}, "params.speaking_rate"),
        ({"speaking_rate": "fast"}, "params.speaking_rate"),
        ({"noise_scale": -0.1}, "params.noise_scale"),
        ({"noise_scale_duration": 11}, "params.noise_scale_duration"),
        ({"speaker": 1}, "params.speaker"),
        ({"speaker": -1}, "params.speaker"),
        ({"volume": 2}, "params.volume"),
    ],
)
def test_bad_params_name_the_field(host, params, field):
    handle = host.load("vits")
    with pytest.raises(EngineError) as caught:
        list(handle.synthesize(TEXT, EngineRequest(params={"seed": 0, **params})))
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", field)


@pytest.mark.parametrize("text", ["", "   ", "1234 ...", "x" * 4001])
def test_bad_text_names_the_field(engines, text):
    with pytest.raises(EngineError) as caught:
        ours(engines["shipped"], text, 0)
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")


def test_durations_past_the_frame_bound_name_speaking_rate(engines):
    with pytest.raises(EngineError) as caught:
        ours(engines["wide"], TEXT, 0, speaking_rate=1e-6)
    assert caught.value.detail["field"] == "params.speaking_rate"


def copy_folder(
    tmp_path: Path, config_change: dict[str, Any] | None = None, drop_key: str | None = None
) -> Path:
    for name in ("vocab.json", "tokenizer_config.json", "model.safetensors"):
        (tmp_path / name).write_bytes((WEIGHTS_DIR / name).read_bytes())
    config = json.loads((WEIGHTS_DIR / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **(config_change or {})}))
    if drop_key:
        tensors = load_file(tmp_path / "model.safetensors")
        del tensors[drop_key]
        save_file(tensors, tmp_path / "model.safetensors")
    return tmp_path


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"hidden_act": "tanh"}, "hidden_act"),
        ({"depth_separable_channels": 4}, "depth_separable_channels"),
        ({"upsample_rates": [8, 8, 2]}, "upsample_kernel_sizes"),
        ({"noise_scale": "loud"}, "noise_scale"),
        ({"model_type": "speecht5"}, "model_type"),
    ],
)
def test_bad_configs_are_refused_naming_the_field(tmp_path, change, words):
    spec = LoadSpec("tiny", "cpu", "float32", model_dir=copy_folder(tmp_path, change))
    with pytest.raises(EngineUnavailable, match=words):
        VitsEngine().load(spec, Runtime(), RequestContext(seed=0))


def test_a_missing_tensor_is_named(tmp_path):
    key = "text_encoder.encoder.layers.0.attention.emb_rel_k"
    spec = LoadSpec("tiny", "cpu", "float32", model_dir=copy_folder(tmp_path, drop_key=key))
    with pytest.raises(LoadError, match="emb_rel_k"):
        VitsEngine().load(spec, Runtime(), RequestContext(seed=0))


def test_half_a_weight_norm_pair_is_named(tmp_path):
    key = "flow.flows.0.wavenet.in_layers.0.parametrizations.weight.original0"
    spec = LoadSpec("tiny", "cpu", "float32", model_dir=copy_folder(tmp_path, drop_key=key))
    with pytest.raises(EngineUnavailable, match="original0"):
        VitsEngine().load(spec, Runtime(), RequestContext(seed=0))


def test_bfloat16_gives_finite_audio(folders):
    spec = LoadSpec("tiny", "cpu", "bf16", model_dir=folders["wide"])
    loaded = VitsEngine().load(spec, Runtime(), RequestContext(seed=0))
    [wave] = ours(loaded, TEXT, 0)
    assert wave.numel() > 0 and torch.isfinite(wave).all()


@pytest.mark.slow
def test_the_contract_passes_every_check():
    from mizuoto_contract import run_contract
    from mizuoto_contract.checks import ALL

    results = run_contract("vits")
    failed = [f"{r.id}: {r.status}\n{r.message}" for r in results if r.status != "passed"]
    assert not failed, "\n".join(failed)
    assert [r.id for r in results] == [check.id for check in ALL]


def test_text_streamed_in_pieces_is_upstreams_audio_of_each_sentence(upstream, engines):
    """Text fed through ctx.text_input, cut mid-word: the chunks are upstream's waveforms for
    the joined text's sentences, as the whole text gives them, each as soon as it is finished."""
    sentences = ["First one. ", "A second? ", "Yes!"]
    text = "".join(sentences)
    feed: queue.Queue[str | None] = queue.Queue()
    seen: list[tuple[float, float | None]] = []
    ctx = RequestContext(seed=11, progress=lambda done, total, _: seen.append((done, total)))
    ctx.text_input = feed
    loaded = engines["narrow-window"]
    with torch.inference_mode():
        stream = loaded.synthesize(text[:3], {}, ctx)
        feed.put(text[3:13])  # "st one. A " ends the first sentence, the second goes on
        first = next(stream)
        assert seen == [(1, None)]  # spoken before the rest of the text came
        for piece in (text[13:15], text[15:], None):
            feed.put(piece)
        got = [torch.from_numpy(c.samples) for c in (first, *stream)]
    wants = theirs(upstream["narrow-window"], sentences, 11)
    assert len(got) == 3
    assert all(torch.equal(g, w) for g, w in zip(got, wants, strict=True))
    assert all(torch.equal(g, w) for g, w in zip(got, ours(loaded, text, 11), strict=True))


def test_text_streamed_through_the_host_equals_the_joined_text(host):
    handle = host.load("vits")
    text = "Hi there, Kim. How are you? Fine"
    whole = [c.samples for c in handle.synthesize(text, EngineRequest(params={"seed": 4}))]
    feed: queue.Queue[str | None] = queue.Queue()
    for piece in (text[5:20], text[20:], None):
        feed.put(piece)
    request = EngineRequest(params={"seed": 4}, text_input=feed)
    streamed = [c.samples for c in handle.synthesize(text[:5], request)]
    assert np.array_equal(np.concatenate(streamed), np.concatenate(whole))
    assert len(streamed) == 3 and request.applied["vits"]["sentences"] == 3


def test_an_abandoned_text_input_ends_with_the_cancel(host):
    feed: queue.Queue[str | None] = queue.Queue()
    request = EngineRequest(params={"seed": 0}, text_input=feed)
    stream = host.load("vits").synthesize("Hello", request)
    threading.Timer(0.1, request.cancel).start()
    started = time.perf_counter()
    with pytest.raises(EngineError) as caught:
        next(stream)
    assert caught.value.code == "cancelled"
    assert time.perf_counter() - started < 2


def test_streamed_text_past_the_limit_names_the_field(host):
    feed: queue.Queue[str | None] = queue.Queue()
    for piece in ("x" * 3999, "yz", None):
        feed.put(piece)
    request = EngineRequest(params={"seed": 0}, text_input=feed)
    with pytest.raises(EngineError) as caught:
        list(host.load("vits").synthesize("a", request))
    assert (caught.value.code, caught.value.detail["field"]) == ("invalid_request", "text")
