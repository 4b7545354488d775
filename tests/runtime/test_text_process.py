"""text in a shared process: no torch, cheap imports, thread-safe caches, a named missing extra."""

# ruff: noqa: RUF001  (full-width and CJK punctuation is what this file is about)

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from mizuoto_runtime.text import Tokenizer, normalize, split_sentences

SUBMODULES = ["_extras", "chat", "normalize", "sentences", "tokenizer", "whisper"]


def run(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_text_and_everything_it_uses_never_import_torch(tmp_path):
    pytest.importorskip("wetext")
    pytest.importorskip("tiktoken")
    import whisper.tokenizer

    from tests.runtime.test_text_tokenizer import save

    folder = save("qwen2", tmp_path)
    vocab = f"{whisper.tokenizer.__file__.rsplit('/', 1)[0]}/assets/gpt2.tiktoken"
    code = f"""
import sys, importlib
import mizuoto_runtime.text as text
for name in {SUBMODULES!r}:
    importlib.import_module("mizuoto_runtime.text." + name)
tokenizer = text.Tokenizer.from_pretrained({str(folder)!r})
tokenizer.apply_chat_template([{{"role": "user", "content": "hi"}}])
text.WhisperTokenizer.from_file({vocab!r}, multilingual=False).encode("hi")
text.normalize("2 cats", "en")
text.split_sentences("One. Two.")
assert "torch" not in sys.modules, "torch was imported"
"""
    run(code)


def test_importing_the_runtime_leaves_text_and_its_libraries_unloaded():
    code = """
import sys, json, mizuoto_runtime
print(json.dumps([m for m in ("mizuoto_runtime.text", "tokenizers", "tiktoken", "wetext", "jinja2")
                  if m in sys.modules]))
import mizuoto_runtime.text
print(json.dumps([m for m in ("tokenizers", "tiktoken", "wetext", "jinja2") if m in sys.modules]))
"""
    before, after = (json.loads(line) for line in run(code).splitlines())
    assert before == [] and after == []


def test_a_missing_extra_is_engine_unavailable_naming_the_extra():
    code = """
import sys, json
sys.modules["wetext"] = None  # this child process only: as if wetext were not installed
from mizuoto_runtime.text import MissingExtra, normalize
from mizuoto_sdk.errors import EngineUnavailable
try:
    normalize("1", "en")
except MissingExtra as error:
    assert isinstance(error, EngineUnavailable) and isinstance(error, ImportError)
    print(json.dumps(error.to_dict()))
"""
    error = json.loads(run(code))
    assert error["code"] == "engine_unavailable"
    assert error["detail"]["extra"] == "wetext" and "mizuoto-sdk[wetext]" in error["message"]


def test_eight_threads_get_the_serial_results(tmp_path):
    pytest.importorskip("wetext")
    from tests.runtime.test_text_tokenizer import CORPUS, TEXTS, save

    tokenizer = Tokenizer.from_pretrained(save("qwen2", tmp_path))
    texts = (TEXTS + CORPUS[:6]) * 4
    english = ["I have 2 cats and $3.50.", "Call me at 10:30 on Jan. 5, 2024.", "50% of 12kg"] * 8
    chinese = ["今天是2024年3月5日。", "价格是35.5元，温度-3℃。", "哪儿有2斤苹果？"] * 8

    def work(seed: int) -> tuple[object, ...]:
        order = texts[seed:] + texts[:seed]
        return (
            [tokenizer.encode(t) for t in order],
            [split_sentences(t, 20) for t in order],
            [normalize(t, "en") for t in english[seed:]],
            [normalize(t, "zh", remove_erhua=bool(seed % 2)) for t in chinese[seed:]],
        )

    serial = [work(seed) for seed in range(8)]
    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(work, range(8))) == serial
