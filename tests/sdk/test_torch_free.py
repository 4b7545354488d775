"""Engines that declare ``uses_torch=False`` run where torch cannot be imported.

The child processes here start with a ``sitecustomize`` that hides torch from every import finder,
as if it were not installed (``import torch`` fails, ``find_spec("torch")`` is None); the engine
is ``notorch`` of the fixture distribution ``mizuoto-fixture-notorch``, whose chunks come from a
child process. One script covers listing, doctor, the host and ``mizuoto synth``, so that the
test starts few interpreters.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mizuoto_sdk import EngineManifest, ModelEntry
from mizuoto_sdk.host import Discovery, RuntimeService

FIXTURE_SITE = Path(__file__).parents[1] / "fixture_site"
PLUGINS = "mizuoto-fixture-notorch,mizuoto-engine-sine"

_HIDE_TORCH = """
import sys


class _HideTorch:
    def __init__(self, finder):
        self._finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "torch":
            return None
        return self._finder.find_spec(name, path, target)

    def __getattr__(self, name):
        return getattr(self._finder, name)


sys.meta_path[:] = [_HideTorch(finder) for finder in sys.meta_path]
"""


@pytest.fixture
def no_torch(tmp_path: Path) -> dict[str, str]:
    """The environment of a child (and its children) where torch cannot be imported."""
    hide = tmp_path / "hide_torch"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(_HIDE_TORCH)
    path = [str(hide), str(FIXTURE_SITE), *filter(None, sys.path)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path), "MIZUOTO_PLUGINS": PLUGINS}


def _child(script: str, environment: dict[str, str], cwd: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


_SCRIPT = """
import contextlib, importlib.util, io, json, sys
from mizuoto_sdk.cli import main
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService

seen = {"torch_findable": importlib.util.find_spec("torch") is not None}


def command(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


code, out, _ = command("engines", "--json")
seen["engines"] = [code, {row["id"]: row["uses_torch"] for row in json.loads(out)}]
code, out, _ = command("doctor", "--json")
doctor = json.loads(out)
seen["doctor"] = [code, doctor["torch"]["installed"],
                  {e["id"]: e["available"] for e in doctor["engines"]}]

service = RuntimeService()
handle = service.load("notorch")
def audio(seed):
    chunks = handle.synthesize("two words", EngineRequest(params={"seed": seed}))
    return b"".join(c.samples.tobytes() for c in chunks)


audio = [audio(seed) for seed in (5, 5, 6)]
seen["host"] = [len(audio[0]), audio[0] == audio[1], audio[0] != audio[2]]
for options in ({"use_runtime": True}, {"list_handle": True}):
    try:
        service.load("notorch", options=options)
    except EngineError as error:
        seen[next(iter(options))] = [error.code, str(error)]
try:
    service.load("sine")
except EngineError as error:
    seen["sine"] = [error.code, error.detail.get("reason"), str(error)]

seen["synth"] = command("synth", "notorch", "hello there", "-o", "notorch.wav", "--seed", "3")[0]
code, _, err = command("synth", "sine", "hello", "-o", "sine.wav")
seen["synth_sine"] = [code, err]
seen["torch_imported"] = "torch" in sys.modules
print(json.dumps(seen))
"""


@pytest.mark.slow
def test_list_doctor_host_and_synth_without_torch(no_torch, tmp_path):
    seen = _child(_SCRIPT, no_torch, tmp_path)
    assert seen["torch_findable"] is False
    assert seen["engines"] == [0, {"notorch": False, "sine": True}]
    # doctor: the torch-free engine is available, the torch engine is not (so doctor exits 1).
    assert seen["doctor"] == [1, False, {"notorch": True, "sine": False}]
    samples, same_seed_equal, other_seed_differs = seen["host"]
    assert samples == 2 * 1600 * 4 and same_seed_equal and other_seed_differs
    code, message = seen["use_runtime"]
    assert code == "engine_error" and "uses_torch=False" in message
    code, message = seen["list_handle"]
    assert code == "engine_error" and "uses_torch=False" in message
    code, reason, message = seen["sine"]
    assert (code, reason) == ("compute_unavailable", "torch_missing")
    assert "pip install 'mizuoto-sdk[torch]'" in message
    assert seen["synth"] == 0
    assert (tmp_path / "notorch.wav").stat().st_size > 44
    code, err = seen["synth_sine"]
    assert code == 1 and "[compute_unavailable]" in err and "mizuoto-sdk[torch]" in err
    assert not (tmp_path / "sine.wav").exists()
    assert seen["torch_imported"] is False


@pytest.mark.slow
def test_contract_passes_on_a_torch_free_engine_without_torch(no_torch, tmp_path):
    report = tmp_path / "report.json"
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_contract", "notorch", "--json", str(report)],
        capture_output=True,
        text=True,
        env=no_torch,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = json.loads(report.read_text())["engines"]
    failed = {
        c["id"]: c["message"]
        for c in run["checks"]
        if c["status"] != "passed" and not c["capability_skip"]
    }
    assert not failed, done.stdout


def test_uses_torch_must_be_a_bool():
    with pytest.raises(TypeError, match="uses_torch"):
        EngineManifest(
            id="x",
            implementation="x.engine:X",
            models=[ModelEntry("m")],
            capabilities=["synthesize"],
            uses_torch="no",
        )


def test_a_torch_free_engine_runs_beside_torch_without_the_runtime(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURE_SITE))
    service = RuntimeService(discovery=Discovery(path=[str(FIXTURE_SITE)], selection=None))
    handle = service.load("notorch")
    chunks = list(handle.synthesize("one two three"))
    assert len(chunks) == 3
    assert service.started_runtime is None
    assert service.describe_models()[0]["components"] == []
    assert service.unload() == ["notorch/default@cpu"]
