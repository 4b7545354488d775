"""The documentation site: complete for the public API, navigable, and built with --strict."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import mizuoto_runtime
import mizuoto_sdk
import mizuoto_sdk.host

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.S | re.M)
INLINE = re.compile(r"`([^`\n]+)`")


def pages() -> list[Path]:
    return sorted(DOCS.rglob("*.md"))


def nav_entries(items: object) -> list[str]:
    """The page paths of a mkdocs nav, however deeply its sections nest."""
    if isinstance(items, str):
        return [items]
    if isinstance(items, list):
        return [page for item in items for page in nav_entries(item)]
    if isinstance(items, dict):
        return [page for value in items.values() for page in nav_entries(value)]
    raise TypeError(f"unexpected nav entry {items!r}")


def python_blocks() -> list[tuple[str, str]]:
    return [
        (f"{page.relative_to(DOCS).as_posix()}#{index}", body)
        for page in pages()
        for index, (lang, body) in enumerate(FENCE.findall(page.read_text(encoding="utf-8")))
        if lang == "python"
    ]


def code_tokens() -> set[str]:
    tokens: set[str] = set()
    for page in pages():
        text = page.read_text(encoding="utf-8")
        code = [body for _, body in FENCE.findall(text)]
        code += INLINE.findall(FENCE.sub("", text))
        tokens.update(re.findall(r"[A-Za-z_]\w*", "\n".join(code)))
    return tokens


@pytest.mark.parametrize("module", [mizuoto_sdk, mizuoto_sdk.host, mizuoto_runtime])
def test_every_public_name_appears_in_the_docs_as_code(module):
    tokens = code_tokens()
    missing = [name for name in module.__all__ if name not in tokens]
    assert missing == [], f"{module.__name__} exports these, but no docs page shows them: {missing}"


def test_the_nav_and_the_pages_agree():
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    listed = nav_entries(config["nav"])
    assert len(listed) == len(set(listed)), f"a page is listed twice: {listed}"
    absent = [page for page in listed if not (DOCS / page).is_file()]
    assert absent == [], f"mkdocs.yml lists pages that do not exist: {absent}"
    unlisted = [p.relative_to(DOCS).as_posix() for p in pages()]
    unlisted = [page for page in unlisted if page not in listed]
    assert unlisted == [], f"pages missing from the mkdocs.yml nav: {unlisted}"


def test_the_docs_have_python_examples():
    assert len(python_blocks()) >= 10


@pytest.mark.parametrize("where, source", python_blocks(), ids=[w for w, _ in python_blocks()])
def test_every_python_example_compiles(where: str, source: str):
    compile(source, where, "exec")


# Pages whose examples are promised to run as written (each a complete program, offline, quick):
# the blocks beside the runtime, and the engine that streams sentence by sentence.
RUNNABLE = (
    "runtime/dsp.md",
    "runtime/text.md",
    "runtime/nn.md",
    "runtime/lm.md",
    "engine/sentences.md",
)
RUN = [(where, source) for where, source in python_blocks() if where.startswith(RUNNABLE)]


@pytest.mark.parametrize("where, source", RUN, ids=[w for w, _ in RUN])
def test_the_examples_of_the_runnable_pages_run(where: str, source: str, tmp_path: Path):
    """Each block in a fresh interpreter, in an empty folder: an example that needs what an
    earlier block made, a file of the checkout or a network fails here."""
    done = subprocess.run(
        [sys.executable, "-c", source],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"


def test_the_site_builds_with_strict(tmp_path: Path):
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    assert (tmp_path / "site" / "index.html").is_file()
    assert (tmp_path / "site" / "contract-checks" / "index.html").is_file()
