"""The prompt's text ids come from tokenizer.json through mizuoto_runtime.text.Tokenizer, and
equal, id for id, the hand-written byte tokenizer they replaced (kept here as the reference)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mizuoto_engine_codeclm import tokenizer as tokenizer_module
from mizuoto_engine_codeclm.make_tokenizer import WEIGHTS_DIR, write
from mizuoto_engine_codeclm.model import ModelConfig
from mizuoto_engine_codeclm.tokenizer import PromptTokenizer, TokenConfig
from mizuoto_sdk import InvalidRequest
from mizuoto_sdk.host import EngineRequest, RuntimeService

pytest.importorskip("tokenizers")


class ByteTokenizer:
    """The engine's tokenizer before tokenizer.json: ``[BOS, byte_base + byte..., SEP]``."""

    def __init__(self, config: TokenConfig) -> None:
        self.config = config
        self.end = config.codebook
        self.bos = self.end + 1
        self.sep = self.end + 2
        self.speaker_base = self.end + 3
        self.byte_base = self.speaker_base + config.speaker_slots * config.speaker_levels
        self.vocab_size = self.byte_base + 256
        self.calls = 0

    @property
    def audio_vocab(self) -> int:
        return self.end + 1

    def text_bytes(self, text: str) -> bytes:
        data = text.strip().encode("utf-8")
        if not data or len(data) > self.config.max_text_bytes:
            raise InvalidRequest("text: empty or too long", {"field": "text"})
        return data

    def speaker_tokens(self, embedding) -> list[int]:
        levels = self.config.speaker_levels
        steps = [round((min(max(float(v), -1.0), 1.0) + 1) / 2 * (levels - 1)) for v in embedding]
        return [self.speaker_base + slot * levels + step for slot, step in enumerate(steps)]

    def prompt(self, text: str, embedding=None) -> list[int]:
        self.calls += 1
        ids = [self.bos, *(self.byte_base + b for b in self.text_bytes(text)), self.sep]
        return ids + (self.speaker_tokens(embedding) if embedding is not None else [])


@pytest.fixture(scope="module")
def config() -> TokenConfig:
    return ModelConfig.from_file(WEIGHTS_DIR / "config.json").tokens


@pytest.fixture(scope="module")
def pair(config) -> tuple[PromptTokenizer, ByteTokenizer]:
    return PromptTokenizer.from_pretrained(WEIGHTS_DIR, config), ByteTokenizer(config)


def test_the_script_reproduces_the_shipped_tokenizer(tmp_path):
    assert write(tmp_path).read_bytes() == (WEIGHTS_DIR / "tokenizer.json").read_bytes()


def test_every_id_range_is_the_old_ones(pair):
    new, old = pair
    for name in ("end", "bos", "sep", "speaker_base", "byte_base", "vocab_size", "audio_vocab"):
        assert getattr(new, name) == getattr(old, name), name
    assert len(new.text) == old.vocab_size
    every_byte = bytes(range(256)).decode("latin-1")  # code points 0..255: one or two bytes each
    assert new.prompt(every_byte + "x") == old.prompt(every_byte + "x")


_texts = st.lists(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=20)
    | st.sampled_from(["<|bos|>", "<|sep|>", "<|code_7|>", "<|end|>", "\u0301", " \t\n", "東京😀"]),
    min_size=1,
    max_size=8,
).map("".join)


@settings(max_examples=200, deadline=None)
@given(text=_texts, voice=st.none() | st.lists(st.floats(-2, 2), min_size=8, max_size=8))
def test_prompts_equal_the_byte_tokenizers_for_any_text(pair, text, voice):
    new, old = pair
    if not text.strip() or len(text.strip().encode()) > new.config.max_text_bytes:
        with pytest.raises(InvalidRequest):
            new.prompt(text, voice)
        return
    assert new.prompt(text, voice) == old.prompt(text, voice)


def test_a_tokenizer_that_does_not_match_the_config_is_refused(tmp_path, config):
    from mizuoto_engine_codeclm.tokenizer import tokenizer_json

    other = TokenConfig(codebook=16, speaker_slots=1, speaker_levels=2, max_text_bytes=8)
    (tmp_path / "tokenizer.json").write_text(tokenizer_json(other))
    with pytest.raises(ValueError, match="make_tokenizer"):
        PromptTokenizer.from_pretrained(tmp_path, config)


TEXTS = ["  café 東京 😀  ", "<|bos|> looks special but is bytes"]


def synthesize_all() -> list[np.ndarray]:
    handle = RuntimeService().load("codeclm")
    out = []
    for text in TEXTS:
        for seed in (0, 7):
            request = EngineRequest(params={"max_frames": 8, "seed": seed, "chunk_frames": 5})
            out.append(np.concatenate([c.samples for c in handle.synthesize(text, request)]))
    return out


def test_synthesized_audio_is_the_byte_tokenizers_bit_for_bit(monkeypatch, config):
    new = synthesize_all()
    made: list[ByteTokenizer] = []

    class Old:
        @staticmethod
        def from_pretrained(model_dir, tokens):
            made.append(ByteTokenizer(tokens))
            return made[-1]

    monkeypatch.setattr(tokenizer_module, "PromptTokenizer", Old)
    old = synthesize_all()
    assert made and made[0].calls == len(TEXTS) * 2  # the reference path really ran
    for a, b in zip(new, old, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
