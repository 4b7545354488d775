"""Regenerate the docs' screenshot of the server's page (docs/images/server-page.png).

Starts ``mizuoto serve --port 0`` with an empty data folder, synthesizes a line with the sine engine
in headless Chromium (the system's, through Playwright) beside a loaded codeclm model, and writes
a 1280x900 PNG.

    python scripts/screenshot_page.py [--out PATH]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
URL = re.compile(r"http://127\.0\.0\.1:\d+")
TEXT = "Mizuoto streams audio while it is being made."


def server_url(process: subprocess.Popen[str]) -> str:
    """The URL the server prints as it starts; its later output is drained so it never blocks."""
    stdout = process.stdout
    assert stdout is not None
    seen = []
    for line in stdout:
        seen.append(line)
        found = URL.search(line)
        if found:
            threading.Thread(target=stdout.read, daemon=True).start()
            return found.group(0)
    raise SystemExit("mizuoto serve exited before printing its URL:\n" + "".join(seen))


def screenshot(url: str, out: Path) -> None:
    from playwright.sync_api import expect, sync_playwright

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("no chromium on PATH (apt-get install chromium)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(url + "/")
        # A model with weights, so the panel shows memory beside sine's (which holds none).
        loaded = page.request.post(url + "/api/v1/runtime/load", data={"engine": "codeclm"})
        if not loaded.ok:
            raise SystemExit(f"loading codeclm failed: {loaded.text()}")
        page.check("input[name=engine][value=sine]")
        page.fill("#text", TEXT)
        page.fill("#param-speed", "1.25")
        page.fill("#seed", "1")
        page.click("#synthesize")
        expect(page.locator("#synthesis")).to_have_attribute("data-state", "done", timeout=60_000)
        expect(page.locator("#runtime tbody tr[data-engine=sine]")).to_have_count(1)
        out.parent.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(out))
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "images" / "server-page.png")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as home:
        process = subprocess.Popen(
            [sys.executable, "-m", "mizuoto_sdk.cli", "serve", "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "MIZUOTO_HOME": home},
        )
        try:
            screenshot(server_url(process), args.out)
        finally:
            process.terminate()
            process.wait(timeout=30)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
