"""max_concurrency: a loaded model's calls queue for a turn, whoever calls and however."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from mizuoto_sdk import CancelledError, EngineManifest, ModelEntry, OperationTimeoutError
from mizuoto_sdk.host import Discovery, EngineRequest, RuntimeService

SITE = Path(__file__).parent / "unsafe_site"
TEXTS = ["a", "bb", "ccc", "dddd", "eeeee", "ffffff"]


@pytest.fixture
def unsafe(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    module = __import__("mizuoto_fixture_unsafe")
    module.MOST[0] = 0
    discovery = Discovery(path=[str(SITE)], selection={"mizuoto-fixture-unsafe"})
    with RuntimeService(discovery=discovery) as service:
        yield service, module


def _concurrently(model, texts):
    """Each text's whole stream, from a thread of its own, all started together."""
    results: dict[str, np.ndarray] = {}
    start = threading.Barrier(len(texts))

    def speak(text: str) -> None:
        start.wait()
        results[text] = np.concatenate([c.samples for c in model.synthesize(text)])

    threads = [threading.Thread(target=speak, args=(text,)) for text in texts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def test_a_model_that_allows_one_call_runs_its_callers_one_at_a_time(unsafe):
    service, module = unsafe
    model = service.load("unsafe")
    results = _concurrently(model, TEXTS)
    assert module.MOST[0] == 1
    rows = {row["id"]: row for row in service.describe_engines()}  # as engines --json shows
    assert (rows["unsafe"]["max_concurrency"], rows["unsafe-unlimited"]["max_concurrency"]) == (
        1,
        None,
    )
    for text in TEXTS:  # each equals its serial run: no call saw another's state
        np.testing.assert_array_equal(results[text], np.full(12, len(text), np.float32))


def test_without_the_declaration_the_same_engine_is_entered_at_once(unsafe):
    # What the declaration prevents: the check above would see it.
    service, module = unsafe
    _concurrently(service.load("unsafe-unlimited"), TEXTS)
    assert module.MOST[0] > 1


def test_a_paused_stream_keeps_its_turn_and_a_queued_call_ends_at_its_timeout(unsafe):
    service, _ = unsafe
    model = service.load("unsafe")
    first = model.synthesize("held")
    next(first)  # paused between chunks: the library keeps this call's state
    with pytest.raises(OperationTimeoutError):
        list(model.synthesize("queued", EngineRequest(timeout=0.3)))
    request = EngineRequest()
    request.cancel()
    with pytest.raises(CancelledError):
        list(model.synthesize("cancelled", request))
    first.close()  # the turn goes back: the next call runs
    assert len(list(model.synthesize("next"))) == 3


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "1"])
def test_max_concurrency_is_a_whole_number_from_one(value):
    with pytest.raises(ValueError, match="max_concurrency"):
        EngineManifest(
            id="x",
            implementation="x:X",
            models=[ModelEntry("a")],
            capabilities=["synthesize"],
            max_concurrency=value,
        )


@pytest.mark.parametrize(
    ("engine", "status"), [("unsafe", "passed"), ("unsafe-unlimited", "failed")]
)
def test_the_contract_passes_the_declared_engine_and_catches_the_undeclared_one(
    engine, status, tmp_path
):
    report = tmp_path / "report.json"
    command = [sys.executable, "-m", "mizuoto_contract", engine]
    env = {**os.environ, "PYTHONPATH": str(SITE), "MIZUOTO_PLUGINS": "mizuoto-fixture-unsafe"}
    subprocess.run(
        [*command, "--check", "determinism.concurrent", "--json", str(report)],
        env=env,
        timeout=300,
        capture_output=True,
        check=False,
    )
    (engine_report,) = json.loads(report.read_text())["engines"]
    assert [(c["id"], c["status"]) for c in engine_report["checks"]] == [
        ("determinism.concurrent", status)
    ]
