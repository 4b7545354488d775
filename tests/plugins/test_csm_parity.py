"""csm against transformers' CsmForConditionalGeneration in the same process, bit for bit.

The shipped tiny checkpoint (a random CSM written by make_weights.py with save_pretrained) is
loaded by both. Upstream runs seeded inside ``fork_rng``; the engine draws from the request's
generator, seeded the same, and ``chunk_frames=0`` decodes once at the end as generate does.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from mizuoto_sdk import AudioChunk
from mizuoto_sdk.host import EngineRequest, RuntimeService

transformers = pytest.importorskip("transformers")

TEXT = "Hello from Mizuoto."
RATE = 24_000


@pytest.fixture(scope="module")
def upstream():
    from mizuoto_engine_csm.make_weights import WEIGHTS_DIR

    model = transformers.CsmForConditionalGeneration.from_pretrained(WEIGHTS_DIR).eval()
    return model, transformers.CsmProcessor.from_pretrained(WEIGHTS_DIR)


@pytest.fixture(scope="module")
def service() -> RuntimeService:
    return RuntimeService()


@pytest.fixture(scope="module")
def csm(service):
    return service.load("csm", dtype="float32")


@pytest.fixture
def voices(service, tmp_path):
    service.settings.set("voices.roots", [tmp_path])
    yield tmp_path
    service.settings.set("voices.roots", [])


def theirs(upstream: Any, conversation: Any, seed: int, **kwargs: Any) -> torch.Tensor:
    model, processor = upstream
    inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        (audio,) = model.generate(**inputs, output_audio=True, **kwargs)
    return audio


def ours(handle: Any, text: str = TEXT, **params: Any) -> tuple[np.ndarray, EngineRequest]:
    request = EngineRequest(params={"chunk_frames": 0, **params})
    chunks = list(handle.synthesize(text, request))
    assert len(chunks) == 1
    return chunks[0].samples, request


def turn(speaker: int, text: str, audio: np.ndarray | None = None) -> dict:
    content: list[dict] = [{"type": "text", "text": text}]
    if audio is not None:
        content.append({"type": "audio", "audio": audio})
    return {"role": str(speaker), "content": content}


def recording(seconds: float = 1.2, seed: int = 3) -> np.ndarray:
    """Something speech-like at 24 kHz: a gliding tone with noise, float32."""
    rng = np.random.default_rng(seed)
    t = np.arange(round(seconds * RATE)) / RATE
    tone = np.sin(2 * np.pi * (120 + 40 * t) * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))
    return (0.3 * tone + 0.02 * rng.standard_normal(t.size)).astype(np.float32)


@pytest.mark.parametrize(
    ("seed", "temperature", "top_k", "max_frames", "speaker"),
    [
        (0, None, None, 5, 0),  # generation_config.json's temperature 0.9 and top_k 50
        (1, 0.6, 5, 4, 1),
        (7, 1.4, 0, 3, 0),  # top_k 0: upstream builds no top-k processor
        (11, 1.0, 1, 3, 42),  # top_k 1 keeps the ties of the largest logit
    ],
)
def test_audio_is_bitwise_generate(csm, upstream, seed, temperature, top_k, max_frames, speaker):
    kwargs = {k: v for k, v in (("temperature", temperature), ("top_k", top_k)) if v is not None}
    expected = theirs(upstream, [turn(speaker, TEXT)], seed, max_new_tokens=max_frames, **kwargs)
    samples, request = ours(csm, seed=seed, max_frames=max_frames, speaker=speaker, **kwargs)
    assert request.applied["csm"]["frames"] == max_frames
    assert torch.equal(torch.from_numpy(samples), expected)


def test_the_default_length_is_generation_configs_max_new_tokens(csm):
    from mizuoto_engine_csm.make_weights import MAX_NEW_TOKENS

    request = EngineRequest(params={"seed": 0, "max_frames": 2})
    list(csm.synthesize(TEXT, request))
    assert request.applied["csm"]["max_frames"] == 2
    assert csm.description["generation"]["max_frames"] == MAX_NEW_TOKENS


def test_prompt_ids_are_the_processors(csm, upstream):
    from mizuoto_engine_csm.make_weights import WEIGHTS_DIR
    from mizuoto_engine_csm.prompt import PromptBuilder, Turn

    _, processor = upstream
    builder = PromptBuilder.from_folder(WEIGHTS_DIR, 258, 259)
    audio = recording(0.5)
    conversation = [turn(3, "Ünïcode — and [brackets]", audio), turn(12, "  spaced  out ")]
    expected = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
    frames = int((expected["input_ids"] == 258).sum())
    made = builder.ids([Turn(3, "Ünïcode — and [brackets]", frames), Turn(12, "  spaced  out ")])
    assert made == expected["input_ids"][0].tolist()


def test_a_voice_is_the_context_turn_generate_conditions_on(csm, upstream, voices):
    audio = recording()
    transcript = "This is how I sound."
    result = csm.prepare_voice(
        AudioChunk(audio, RATE),
        voices / "anna",
        EngineRequest(params={"transcript": transcript, "speaker": 4}),
    )
    model, _ = upstream
    with torch.no_grad():
        codes = model.codec_model.encode(torch.from_numpy(audio)[None, None]).audio_codes
    assert result["frames"] == codes.shape[-1]
    conversation = [turn(4, transcript, audio), turn(1, TEXT)]
    expected = theirs(upstream, conversation, 5, max_new_tokens=4)
    samples, request = ours(csm, seed=5, max_frames=4, speaker=1, voice="anna")
    assert request.applied["csm"]["voice"] is True
    assert torch.equal(torch.from_numpy(samples), expected)
    plain, _ = ours(csm, seed=5, max_frames=4, speaker=1)
    assert not np.array_equal(plain, samples)


def test_from_model_config_makes_the_depth_decoder_greedy_as_upstream(upstream, tmp_path):
    """generation_config.json with "_from_model_config": true: from_pretrained drops the
    depth_decoder_* keys (the depth decoder then decodes greedily) and keeps the others."""
    import json
    import shutil

    from mizuoto_engine_csm.make_weights import WEIGHTS_DIR

    folder = tmp_path / "pitfall"
    shutil.copytree(WEIGHTS_DIR, folder)
    settings = json.loads((folder / "generation_config.json").read_text())
    settings.update({"_from_model_config": True, "temperature": 0.7})
    (folder / "generation_config.json").write_text(json.dumps(settings))
    model = transformers.CsmForConditionalGeneration.from_pretrained(folder).eval()
    _, processor = upstream
    expected = theirs((model, processor), [turn(0, TEXT)], 9, max_new_tokens=3)
    handle = RuntimeService({"engines.csm.model_dir": str(folder)}).load("csm")
    samples, request = ours(handle, seed=9, max_frames=3)
    assert request.applied["csm"]["temperature"] == 0.7
    assert torch.equal(torch.from_numpy(samples), expected)
    other, _ = ours(handle, seed=10, max_frames=3)
    assert not np.array_equal(other, samples)  # codebook 0 still samples
