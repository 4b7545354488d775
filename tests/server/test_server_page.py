"""The server's page in a real headless Chromium: engines, a streamed synthesis, errors, unload.

Driven by Playwright with the system's chromium (never a downloaded browser); skipped when either
is missing. Every wait is Playwright's own (expect, wait_for_function) with a timeout.
"""

from __future__ import annotations

import re
import shutil
import struct
from collections.abc import Iterator

import pytest

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

SYNTH_S = 30_000  # ms: a sine synthesis (first load included) on a busy two-core machine
TEXT = "Hello from the page."
SEED = 7
# True when the waveform canvas has more lit pixels than its one-pixel axis line.
WAVEFORM_DRAWN = """() => {
    const canvas = document.querySelector('#waveform');
    const pixels = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
    let lit = 0;
    for (let i = 3; i < pixels.length; i += 4) if (pixels[i]) lit++;
    return lit > 2 * canvas.width;
}"""


def wav_sample_count(data: bytes) -> tuple[int, int]:
    """(sample rate, samples) of a 16-bit mono WAV whose sizes may say 0xFFFFFFFF (unknown)."""
    assert data[:4] == b"RIFF" and data[8:12] == b"WAVE", data[:12]
    offset, rate = 12, None
    while offset + 8 <= len(data):
        chunk, size = data[offset : offset + 4], struct.unpack_from("<I", data, offset + 4)[0]
        if chunk == b"fmt ":
            rate = struct.unpack_from("<I", data, offset + 12)[0]
        if chunk == b"data":
            assert rate is not None, "data before fmt"
            return rate, (len(data) - offset - 8) // 2
        offset += 8 + size + size % 2
    raise AssertionError("no data chunk")


@pytest.fixture(scope="module")
def browser() -> Iterator[sync_api.Browser]:
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, args=["--autoplay-policy=no-user-gesture-required"]
        )
        yield launched
        launched.close()


@pytest.fixture
def page(browser, server) -> Iterator[sync_api.Page]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    opened.goto(server.url + "/")
    expect(opened.locator("#engines")).to_have_attribute("data-state", "loaded")
    yield opened
    context.close()
    assert not errors, f"uncaught errors in the page: {errors}"


def synthesize(page, engine: str, text: str, **params: str) -> None:
    page.check(f"input[name=engine][value={engine}]")
    page.fill("#text", text)
    for name, value in params.items():
        field = page.locator(f"#param-{name}")
        if field.evaluate("node => node.tagName") == "SELECT":
            field.select_option(value)
        else:
            field.fill(value)
    page.fill("#seed", str(SEED))
    page.click("#synthesize")


def test_engines_are_listed_and_those_that_cannot_synthesize_are_disabled(page, server):
    engines = server.client.get("/api/v1/engines").json()
    for engine in engines:
        row = page.locator(f"label[data-engine={engine['id']}]")
        expect(row).to_contain_text(engine["name"])
        expect(row).to_contain_text(engine["status"])
        radio = row.locator("input")
        if engine["status"] == "ok" and "synthesize" in engine["capabilities"]:
            expect(radio).to_be_enabled()
        else:
            expect(radio).to_be_disabled()
            expect(row).to_contain_text("Cannot synthesize")
    page.check("input[name=engine][value=sine]")
    expect(page.locator("#param-speed")).to_have_value("1")


def test_engines_that_cannot_synthesize_cannot_be_chosen_and_say_why(browser, server):
    def with_unusable_engines(route) -> None:
        engines = route.fetch().json()
        broken = {**engines[0], "id": "broken", "status": "import_error", "error": "no module x"}
        converter = {**engines[0], "id": "converter", "capabilities": ["convert"]}
        route.fulfill(json=[*engines, broken, converter])

    context = browser.new_context()
    try:
        page = context.new_page()
        page.route("**/api/v1/engines", with_unusable_engines)
        page.goto(server.url + "/")
        expect(page.locator("#engines")).to_have_attribute("data-state", "loaded")
        for engine, why in [("broken", "no module x"), ("converter", "does not synthesize")]:
            expect(page.locator(f"input[name=engine][value={engine}]")).to_be_disabled()
            expect(page.locator(f"label[data-engine={engine}] .reason")).to_contain_text(why)
    finally:
        context.close()


def test_a_synthesis_streams_plays_and_draws(page, server):
    synthesize(page, "sine", TEXT, speed="1.5")
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "done", timeout=SYNTH_S)
    page.wait_for_function(
        "() => { const a = document.querySelector('#audio');"
        " return a.readyState >= 1 && !a.error && Number.isFinite(a.duration); }"
    )
    state = page.evaluate("window.mizuotoPage")
    assert state["firstAudioMs"] is not None and state["firstAudioMs"] <= state["totalMs"]

    response = server.client.post(
        "/api/v1/synthesize",
        json={"engine": "sine", "text": TEXT, "params": {"speed": 1.5}, "seed": SEED},
        timeout=SYNTH_S / 1000,
    )
    assert response.status_code == 200, response.text
    rate, samples = wav_sample_count(response.content)
    assert (state["sampleRate"], state["sampleCount"]) == (rate, samples)
    duration = page.evaluate("document.querySelector('#audio').duration")
    assert duration == pytest.approx(samples / rate, rel=0.05)

    assert page.evaluate(WAVEFORM_DRAWN), "the waveform canvas shows nothing but its axis"
    expect(page.locator("#status")).to_contain_text("first audio")


def test_the_models_panel_lists_the_model_and_unloads_it(page, server):
    synthesize(page, "sine", TEXT)
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "done", timeout=SYNTH_S)
    row = page.locator("#runtime tbody tr[data-engine=sine]")
    expect(row).to_have_count(1)
    name = row.get_attribute("data-model")
    loaded = [m["name"] for m in server.client.get("/api/v1/runtime").json()["models"]]
    assert name in loaded
    expect(row).to_have_attribute("data-state", "idle")

    row.locator("button.unload").click()
    expect(page.locator(f'#runtime tbody tr[data-model="{name}"]')).to_have_count(0)
    expect(page.locator("#runtime-message")).to_contain_text(name)
    loaded = [m["name"] for m in server.client.get("/api/v1/runtime").json()["models"]]
    assert name not in loaded


@pytest.mark.parametrize(
    ("engine", "text", "params"),
    [("sine", "", {}), ("faulty", TEXT, {"fault": "invalid", "at": "0"})],
    ids=["empty-text", "engine-rejects"],
)
def test_an_api_error_is_shown_with_its_code(page, engine, text, params):
    synthesize(page, engine, text, **params)
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "error", timeout=SYNTH_S)
    expect(page.locator("#error")).to_be_visible()
    expect(page.locator("#error .code")).to_have_text("invalid_request")
    assert page.evaluate("window.mizuotoPage.error.code") == "invalid_request"


def test_a_stream_the_server_cuts_shows_the_engines_error(page):
    synthesize(page, "faulty", TEXT, fault="crash", at="2")
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "error", timeout=SYNTH_S)
    expect(page.locator("#error .code")).to_have_text("engine_error")
    expect(page.locator("#error")).to_contain_text("crashed on purpose")


def test_stop_ends_the_stream_and_the_server_cancels_it(page):
    synthesize(page, "faulty", TEXT, fault="slow", chunks="200", delay="0.1")
    page.wait_for_function("window.mizuotoPage.sampleCount > 0", timeout=SYNTH_S)
    page.wait_for_function(WAVEFORM_DRAWN)  # drawn while the stream still runs
    row = page.locator("#runtime tbody tr[data-engine=faulty]")
    expect(row).to_have_attribute("data-state", "busy", timeout=5_000)
    page.click("#stop")
    expect(page.locator("#synthesis")).to_have_attribute("data-state", "stopped")
    # 200 chunks at 0.1 s keep the model busy for 20 s: idle well before means cancelled.
    expect(row).to_have_attribute("data-state", "idle", timeout=10_000)
    expect(page.locator("#audio")).to_have_attribute("src", re.compile(r"^blob:"))
