"""The mizuoto command: exit codes, messages, WAV output, and what it leaves behind."""

from __future__ import annotations

import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import wave
from pathlib import Path

import pytest
from conftest import PLUGIN_SITES

from mizuoto_sdk import cli
from mizuoto_sdk.cli import main

# A real distribution of plugins and engines that misbehave on purpose (see its docstring).
FIXTURE_SITE = Path(__file__).parent / "fixture_site"
FAULTS = "mizuoto-fixture-faults"


def fixture_env(*distributions: str) -> dict[str, str]:
    return {"PYTHONPATH": str(FIXTURE_SITE), "MIZUOTO_PLUGINS": ",".join(distributions)}


@pytest.fixture
def faults(monkeypatch):
    """The fixture distribution and sine, as the in-process command finds them."""
    monkeypatch.syspath_prepend(str(FIXTURE_SITE))
    monkeypatch.setenv("MIZUOTO_PLUGINS", f"{FAULTS},mizuoto-engine-sine")


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def test_engines_json_lists_sine_ok_beside_a_broken_plugin(tmp_path):
    broken = {"PYTHONPATH": str(PLUGIN_SITES / "import_fails")}  # three plugins that fail to import
    done = run("engines", "--json", env=broken)
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    assert rows["sine"]["status"] == "ok"
    assert rows["sine"]["distribution"] == "mizuoto-engine-sine"
    assert (rows["sine"]["text_input"], rows["codeclm"]["text_input"]) == (True, False)
    assert rows["raises"]["status"] == "failed"
    assert rows["raises"]["distribution"] == "mizuoto-fixture-import-fails"
    assert "RuntimeError: no such backend" in rows["raises"]["error"]
    synth = run("synth", "sine", "still works", "-o", str(tmp_path / "ok.wav"), env=broken)
    assert synth.returncode == 0, synth.stderr


def test_engines_table(capsys):
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["ID", "DISTRIBUTION", "VERSION", "STATUS"]
    assert any(
        line.split()[:4] == ["sine", "mizuoto-engine-sine", "0.1.0", "ok"]
        for line in out.splitlines()
    )


def test_engines_table_lists_each_engines_params_with_their_defaults(
    host_engine, monkeypatch, capsys
):
    monkeypatch.setenv("MIZUOTO_PLUGINS", "mizuoto-fixture-host,mizuoto-engine-sine")
    assert main(["engines"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "  sine: params: speed=1.0" in lines
    assert (
        "  declared: params: mode=tones, chunks=3, level=0.5, loud=false, style=plain, voice"
        in lines
    )
    assert not any(line.startswith("  hosted: params") for line in lines)  # declares none
    below = [line for line in lines if line.startswith(" ")]
    assert below and all(len(line) <= 100 for line in below)


def test_synth_is_deterministic_under_a_seed_and_writes_a_valid_wav(tmp_path, capsys):
    paths = [tmp_path / f"{name}.wav" for name in ("a", "b", "c")]
    for path, seed in zip(paths, ("7", "7", "8"), strict=True):
        assert main(["synth", "sine", "hello world", "-o", str(path), "--seed", seed]) == 0
    a, b, c = (p.read_bytes() for p in paths)
    assert a == b and a != c
    with wave.open(str(paths[0])) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, 16000)
        assert wav.getnframes() > 0
    out = capsys.readouterr().out
    assert "seed 7" in out and "first chunk" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["synth", "nope", "hi", "-o", "{tmp}/x.wav"],
            "[engine_not_found]: no engine 'nope'; known engines: ",
        ),
        (["synth", "sine", "  ", "-o", "{tmp}/x.wav"], "TEXT is empty"),
        (["synth", "sine", "hi", "-o", "{tmp}/missing/x.wav"], "cannot write"),
        (["synth", "sine", "hi", "-o", "{tmp}/" + "a" * 300 + ".wav"], "cannot write"),
        (["synth", "sine", "hi", "-o", "{tmp}"], "is a folder"),
        (["synth", "sine", "hi", "-o", "{tmp}/x.wav", "--dtype", "fp8"], "[invalid_request]"),
        (["synth", "sine", "hi", "-o", "{tmp}/x.wav", "--device", "tpu"], "[invalid_request]"),
        (["synth", "sine", "hi", "-o", "{tmp}/x.wav", "--model", "zz"], "known models: tone"),
        (["synth", "sine", "hi"], "required: -o"),
        (["doctor", "nope"], "[engine_not_found]"),
        (["frobnicate"], "invalid choice"),
    ],
)
def test_user_mistakes_exit_2_with_a_message_and_leave_no_file(tmp_path, capsys, argv, message):
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_an_engine_failure_exits_1_with_its_code_and_leaves_no_partial_file(tmp_path, capsys):
    out = tmp_path / "x.wav"
    assert main(["synth", "sine", "hi", "-o", str(out), "--device", "cuda:7"]) == 1
    assert "[compute_unavailable]" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_a_failed_run_keeps_an_existing_output_untouched(tmp_path):
    out = tmp_path / "x.wav"
    out.write_bytes(b"previous")
    assert main(["synth", "sine", "hi", "-o", str(out), "--device", "cuda:7"]) == 1
    assert out.read_bytes() == b"previous"


def test_doctor_and_runtime(capsys):
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["torch"]["installed"] is True
    assert report["torch"]["build"] == "cpu" or report["torch"]["build"].startswith("cuda")
    assert {
        "id": "sine",
        "status": "ok",
        "available": True,
        "missing_extras": [],
        "missing_programs": [],
        "error": None,
        "warnings": [],
    } in report["engines"]
    assert main(["doctor", "sine"]) == 0
    assert "engine sine: available" in capsys.readouterr().out
    assert main(["runtime"]) == 0
    assert "no models loaded" in capsys.readouterr().out


def test_the_mizuoto_executable_runs_the_command_as_a_process():
    (script,) = [
        e for e in importlib.metadata.entry_points(group="console_scripts") if e.name == "mizuoto"
    ]
    assert script.load() is cli.run


def test_engines_ends_promptly_whatever_plugins_exit_or_leave_running():
    # The hooks call sys.exit / raise a BaseException; another plugin starts a thread that never
    # ends at import. Before, the first ended the command silently, the second hung it at exit.
    done = run(
        "engines",
        "--json",
        env=fixture_env(FAULTS, "mizuoto-fixture-thread", "mizuoto-engine-sine"),
    )
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    assert rows["sine"]["status"] == "ok"
    assert rows["hook-exits"]["status"] == "failed"
    assert "SystemExit: 4" in rows["hook-exits"]["error"]
    assert rows["hook-halts"]["status"] == "failed"
    assert "fixture-plugin-thread" in done.stderr  # named, so that its author can find it


def test_doctor_imports_each_implementation_and_says_why_it_cannot_be_used():
    # A fresh process, so that an implementation importing torch is seen doing it.
    done = run("doctor", "--json", env=fixture_env(FAULTS))
    assert done.returncode == 1, done.stderr
    engines = {e["id"]: e for e in json.loads(done.stdout)["engines"]}
    for engine_id, reason in [
        ("exits-on-import", "SystemExit: 3"),
        ("unknown-dtype", "unknown dtype 'float8'"),
        ("misspelt", "did you mean 'WaitingEngine'?"),
    ]:
        assert engines[engine_id]["status"] == "unavailable"
        assert engines[engine_id]["available"] is False
        assert reason in engines[engine_id]["error"]
    assert engines["waits"]["available"] is True and engines["waits"]["warnings"] == []
    assert engines["imports-torch"]["available"] is True
    assert "imports torch" in engines["imports-torch"]["warnings"][0]


def test_doctor_engine_names_a_misspelt_class(faults, capsys):
    assert main(["doctor", "misspelt"]) == 1
    assert "engine misspelt: unavailable: " in capsys.readouterr().out
    assert main(["doctor", "waits"]) == 0
    assert "engine waits: available" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("engine_id", "reasons"),
    [
        ("exits-on-import", ["[engine_unavailable]", ":ExitingEngine: SystemExit: 3"]),
        ("unknown-dtype", ["[engine_unavailable]", "DTYPES is not valid", "dtype 'float8'"]),
        ("number-dtypes", ["[engine_unavailable]", "NumberDtypesEngine.DTYPES is not valid"]),
        ("exits-in-load", ["[engine_error]", "SystemExit: 7"]),
    ],
)
def test_synth_with_an_engine_that_cannot_be_used_says_why(
    faults, tmp_path, capsys, engine_id, reasons
):
    assert main(["synth", engine_id, "hi", "-o", str(tmp_path / "x.wav")]) == 1
    err = capsys.readouterr().err
    assert all(reason in err for reason in reasons), err
    assert "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("stop", "said"), [(signal.SIGTERM, "terminated"), (signal.SIGINT, "interrupted")]
)
def test_a_signal_during_synth_removes_the_unfinished_file_and_says_one_line(tmp_path, stop, said):
    command = [sys.executable, "-m", "mizuoto_sdk.cli", "synth", "waits", "hi", "-o"]
    process = subprocess.Popen(
        [*command, str(tmp_path / "out.wav")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **fixture_env(FAULTS)},
        # A shell runs a background job with SIGINT ignored, and the child would inherit that
        # (Python then installs no handler): the command must see the signal as a terminal sends it.
        preexec_fn=_default_sigint,
    )
    try:
        for line in process.stderr:  # the engine says when it is inside synthesize
            if line.strip() == "synthesizing":
                break
        assert [p.suffix for p in tmp_path.iterdir()] == [".part"]
        process.send_signal(stop)
        _, err = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == -stop  # ended by the signal, as Python does for Ctrl-C
    assert err.splitlines() == [f"mizuoto: {said}"]
    assert list(tmp_path.iterdir()) == []


def test_the_longest_output_name_the_file_system_accepts_works(tmp_path):
    name = "a" * (os.pathconf(tmp_path, "PC_NAME_MAX") - 4) + ".wav"
    assert main(["synth", "sine", "hello", "-o", str(tmp_path / name)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == [name]


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """`mizuoto engines --json | head -c 1`: the pipe closes before the command writes."""
    child = subprocess.Popen(
        [sys.executable, "-m", "mizuoto_sdk.cli", "engines", "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stderr is not None
    child.stdout.close()  # long before the child has imported anything
    stderr = child.stderr.read()
    child.stderr.close()
    assert child.wait(timeout=120) == 1
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr
