"""The page's convert task in a real headless Chromium: a WAV file in, the engine's audio streamed
back, the same as the API's answer for the same file and seed.

Driven by Playwright with the system's chromium (never a downloaded browser); skipped when either
is missing. Every wait is Playwright's own, with a timeout.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from server_support import RunningServer

from mizuoto_sdk.audio import write_wav

sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the page tests need playwright (pip install playwright)"
)
expect = sync_api.expect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip(
        "the page tests need a chromium executable on PATH (apt-get install chromium)",
        allow_module_level=True,
    )

RUN_MS = 30_000  # a convert (first load included) on a busy two-core machine
SEED = 4


@pytest.fixture(scope="module")
def page(server: RunningServer) -> Iterator[sync_api.Page]:
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--autoplay-policy=no-user-gesture-required"]
        )
        opened = browser.new_page()
        errors: list[str] = []
        opened.on("pageerror", lambda error: errors.append(str(error)))
        opened.goto(server.url + "/")
        expect(opened.locator("#engines")).to_have_attribute("data-state", "loaded")
        yield opened
        browser.close()
        assert not errors, f"uncaught errors in the page: {errors}"


def test_the_page_converts_a_wav_file_as_the_api_does(
    page: sync_api.Page, server: RunningServer, tmp_path: Path
) -> None:
    recording = tmp_path / "in.wav"
    noise = np.random.default_rng(3).uniform(-0.5, 0.5, 3000).astype(np.float32)
    with recording.open("wb") as out:
        write_wav(out, noise, 16000)
    page.check("input[name=engine][value=faulty]")
    expect(page.locator("#capability option")).to_have_text(["synthesize", "convert"])
    expect(page.locator("#audio-in")).to_be_hidden()
    page.select_option("#capability", "convert")
    expect(page.locator("#audio-in")).to_be_visible()
    expect(page.locator("#text-in")).to_be_hidden()
    expect(page.locator("#synthesize")).to_have_text("Convert")
    page.set_input_files("#input-audio", str(recording))
    page.fill("#seed", str(SEED))
    page.click("#synthesize")
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "done", timeout=RUN_MS)
    state = page.evaluate("window.mizuotoPage")

    files = {
        "audio": ("in.wav", recording.read_bytes(), "audio/wav"),
        "request": (None, json.dumps({"engine": "faulty", "seed": SEED}).encode()),
    }
    answer = server.client.post(
        "/api/v1/convert", files=files, headers={"X-Mizuoto-Client": "test"}
    )
    assert answer.status_code == 200, answer.text
    assert (state["sampleRate"], state["sampleCount"]) == (16000, (len(answer.content) - 44) // 2)
    assert state["sampleCount"] == noise.size


def test_convert_without_a_file_says_what_is_missing(page: sync_api.Page) -> None:
    page.reload()
    expect(page.locator("#engines")).to_have_attribute("data-state", "loaded")
    page.check("input[name=engine][value=faulty]")
    page.select_option("#capability", "convert")
    page.click("#synthesize")
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "error", timeout=RUN_MS)
    expect(page.locator("#error .message")).to_contain_text("audio: choose a WAV file")
