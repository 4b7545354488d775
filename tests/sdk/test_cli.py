"""The mizuoto command: exit codes, messages, WAV output, and what it leaves behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave

import pytest

from mizuoto_sdk.cli import main


def run(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", *argv],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )


def test_engines_json_lists_sine_ok_beside_a_broken_plugin(make_dist, unique, site):
    broken = unique("broken")
    make_dist(
        "mizuoto-engine-broken", {broken: "raise RuntimeError('bad wheel')"}, {"broken": broken}
    )
    done = run("engines", "--json", env={"PYTHONPATH": str(site)})
    assert done.returncode == 0, done.stderr
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    assert rows["sine"]["status"] == "ok"
    assert rows["sine"]["distribution"] == "mizuoto-engine-sine"
    assert rows["broken"]["status"] == "failed"
    assert "RuntimeError: bad wheel" in rows["broken"]["error"]
    synth = run(
        "synth", "sine", "still works", "-o", str(site / "ok.wav"), env={"PYTHONPATH": str(site)}
    )
    assert synth.returncode == 0, synth.stderr


def test_engines_table(capsys):
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split()[:4] == ["ID", "DISTRIBUTION", "VERSION", "STATUS"]
    assert any(
        line.split()[:4] == ["sine", "mizuoto-engine-sine", "0.1.0", "ok"]
        for line in out.splitlines()
    )


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
        "error": None,
    } in report["engines"]
    assert main(["doctor", "sine"]) == 0
    assert "engine sine: available" in capsys.readouterr().out
    assert main(["runtime"]) == 0
    assert "no models loaded" in capsys.readouterr().out
