"""The commands that make audio: synth's params, inputs and outputs, convert, voice prepare,
and the progress they show."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from conftest import HOST_FIXTURE_SITE

from mizuoto_sdk.audio import read_wav, write_wav
from mizuoto_sdk.cli import main
from mizuoto_sdk.cli.progress import Progress


@pytest.fixture
def fixtures(host_engine, monkeypatch):
    """``hosted`` (no declared params, not stochastic), ``declared`` (params, convert) and sine."""
    monkeypatch.setenv("MIZUOTO_PLUGINS", "mizuoto-fixture-host,mizuoto-engine-sine")
    return host_engine


def wav_bytes_ok(data: bytes) -> bool:
    return data[:4] == b"RIFF" and data[8:12] == b"WAVE"


def test_params_are_typed_by_the_declaration_and_json_reports_them(fixtures, tmp_path, capsys):
    out = tmp_path / "a.wav"
    argv = ["synth", "declared", "hi", "-o", str(out), "--json", "--voice", "v1"]
    argv += ["--param", "mode=echo_params", "--param", "level=1", "--param", "loud=yes"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["output"] == str(out) and record["sample_rate"] == 16000
    assert record["chunks"] == 3 and record["duration"] == pytest.approx(12 / 16000)
    assert {"load", "first_chunk", "total"} <= set(record["timings"])
    assert isinstance(record["applied"], dict) and record["warnings"] == []
    assert record["seed"] is None  # declared is not stochastic
    assert read_wav(out).samples.shape == (12,)
    assert record["params"] == {
        "mode": "echo_params",
        "level": 1.0,
        "loud": True,
        "voice": os.path.abspath("v1"),  # declared a path: read from the current folder
    }


def test_only_a_stochastic_engine_reports_a_seed(fixtures, tmp_path, capsys):
    for engine, stochastic in (("declared", False), ("sine", True)):
        argv = ["synth", engine, "hi", "-o", str(tmp_path / f"{engine}.wav"), "--json"]
        assert main(argv) == 0
        record = json.loads(capsys.readouterr().out)
        if stochastic:  # the seed the host drew: the same as applied, and it reproduces the audio
            assert isinstance(record["seed"], int) and record["seed"] == record["applied"]["seed"]
        else:  # the output does not depend on a seed: none is reported, in either place
            assert record["seed"] is None and "seed" not in record["applied"]
    argv = ["voice", "prepare", "declared", str(tmp_path / "me.wav"), "-o", str(tmp_path / "v")]
    write_wav(tmp_path / "me.wav", np.zeros(1600, dtype=np.float32), 16000)
    assert main([*argv, "--json"]) == 0
    assert "seed" not in json.loads(capsys.readouterr().out)["applied"]


@pytest.fixture
def named_voice(fixtures, tmp_path, monkeypatch):
    """Engine ``named`` (``mizuoto-fixture-named``): the ``hosted`` engine, declaring its
    ``voice`` param a ``str`` (a voice name), installed into a site of its own."""
    site = tmp_path / "named-site"
    info = site / "mizuoto_fixture_named-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: mizuoto-fixture-named\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text("[mizuoto.engines]\nnamed = mizuoto_fixture_named\n")
    (site / "mizuoto_fixture_named.py").write_text(
        "from mizuoto_sdk import EngineManifest, ModelEntry, Param, hookimpl\n\n\n"
        "@hookimpl\n"
        "def mizuoto_engines():\n"
        "    return [\n"
        "        EngineManifest(\n"
        "            id='named',\n"
        "            implementation='mizuoto_fixture_host.engine:HostEngine',\n"
        "            models=[ModelEntry('a')],\n"
        "            capabilities=['synthesize'],\n"
        "            devices=['cpu'],\n"
        "            params=[Param('voice', 'str', 'en', help='a voice name')],\n"
        "        )\n"
        "    ]\n"
    )
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setenv("MIZUOTO_PLUGINS", "mizuoto-fixture-host,mizuoto-fixture-named")


@pytest.mark.parametrize("option", [["--voice", "de"], ["--param", "voice=de"]])
def test_a_voice_declared_a_string_is_given_as_typed(named_voice, tmp_path, capsys, option):
    assert main(["synth", "named", "hi", "-o", str(tmp_path / "a.wav"), "--json", *option]) == 0
    assert json.loads(capsys.readouterr().out)["params"] == {"voice": "de"}


def test_an_engine_without_declared_params_gets_the_text(fixtures, tmp_path, capsys):
    argv = ["synth", "hosted", "hi", "-o", str(tmp_path / "a.wav"), "--param", "chunks=2"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "in 2 chunks" in out and "seed" not in out  # not stochastic: no seed shown


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--param", "levl=1"], "did you mean 'level'? (known params: chunks, level, loud"),
        (["--param", "level=2"], "params.level: expected a number in (0, 1]"),
        (["--param", "level"], "expected NAME=VALUE"),
        (["--param", "level=1", "--param", "level=0.5"], "given twice"),
        (["--param", "voice=a", "--voice", "b"], "both set voice"),
    ],
)
def test_bad_params_exit_2_naming_the_param(fixtures, tmp_path, capsys, extra, message):
    out = tmp_path / "a.wav"
    assert main(["synth", "declared", "hi", "-o", str(out), *extra]) == 2
    assert message in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_voice_is_refused_for_an_engine_without_a_voice_param(fixtures, tmp_path, capsys):
    assert main(["synth", "sine", "hi", "-o", str(tmp_path / "a.wav"), "--voice", "v"]) == 2
    assert "declares no 'voice' param" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["synth", "sine", "-o", "{tmp}/a.wav"], "give the words"),
        (["synth", "sine", "hi", "--text-file", "{tmp}/t.txt", "-o", "{tmp}/a.wav"], "once"),
        (["synth", "sine", "--text-file", "{tmp}/none.txt", "-o", "{tmp}/a.wav"], "cannot be read"),
        (["synth", "sine", "hi", "-o", "{tmp}/a.mp3"], ".mp3 is not a supported format"),
        (["synth", "sine", "hi", "-o", "{tmp}/a"], "not a supported format"),
        (["synth", "sine", "hi", "-o", "-", "--json"], "both write to standard output"),
    ],
)
def test_input_and_output_mistakes_exit_2(fixtures, tmp_path, capsys, argv, message):
    (tmp_path / "t.txt").write_text("words")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.txt"]


def test_text_comes_from_a_file_or_standard_input(fixtures, tmp_path, monkeypatch):
    (tmp_path / "t.txt").write_text("hello world\n", encoding="utf-8")
    from_file = ["--text-file", str(tmp_path / "t.txt"), "-o", str(tmp_path / "f.wav")]
    assert main(["synth", "sine", *from_file, "--seed", "3"]) == 0
    monkeypatch.setattr(sys, "stdin", io.StringIO("hello world\n"))
    assert main(["synth", "sine", "-", "-o", str(tmp_path / "s.wav"), "--seed", "3"]) == 0
    assert (tmp_path / "f.wav").read_bytes() == (tmp_path / "s.wav").read_bytes()


def test_output_to_stdout_is_the_wav_alone(fixtures, tmp_path, capsysbinary):
    assert main(["synth", "sine", "hello", "-o", "-", "--seed", "7"]) == 0
    captured = capsysbinary.readouterr()
    assert wav_bytes_ok(captured.out)
    assert b"wrote standard output" in captured.err and b"seed 7" in captured.err
    assert main(["synth", "sine", "hello", "-o", str(tmp_path / "a.wav"), "--seed", "7"]) == 0
    assert (tmp_path / "a.wav").read_bytes() == captured.out


def test_a_failing_run_to_stdout_writes_nothing_there(fixtures, capsysbinary):
    assert main(["synth", "declared", "hi", "-o", "-", "--param", "mode=raise"]) == 1
    captured = capsysbinary.readouterr()
    assert captured.out == b"" and b"[engine_error]" in captured.err


def test_convert_reads_any_wav_and_writes_the_engine_output(fixtures, tmp_path, capsys):
    source = tmp_path / "in.wav"
    samples = np.linspace(-0.5, 0.5, 400, dtype=np.float32)
    write_wav(source, samples, 16000)
    out = tmp_path / "out.wav"
    argv = ["convert", "declared", str(source), "-o", str(out), "--param", "level=1", "--json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["chunks"] == 2 and record["sample_rate"] == 16000
    assert np.array_equal(read_wav(out).samples, read_wav(source).samples)


def test_convert_refuses_an_engine_without_it_and_a_bad_input(fixtures, tmp_path, capsys):
    write_wav(tmp_path / "in.wav", np.zeros(100, np.float32), 16000)
    assert main(["convert", "sine", str(tmp_path / "in.wav"), "-o", str(tmp_path / "o.wav")]) == 2
    assert "[capability_not_supported]" in capsys.readouterr().err
    (tmp_path / "bad.wav").write_bytes(b"nope")
    bad = ["convert", "declared", str(tmp_path / "bad.wav"), "-o", str(tmp_path / "o.wav")]
    assert main(bad) == 2
    assert "is not a WAV file" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.wav", "in.wav"]


def test_voice_prepare_writes_the_folder_and_says_how_to_use_it(fixtures, tmp_path, capsys):
    write_wav(tmp_path / "me.wav", np.zeros(1600, np.float32), 16000)
    voice = tmp_path / "voices" / "me"
    assert main(["voice", "prepare", "declared", str(tmp_path / "me.wav"), "-o", str(voice)]) == 0
    out = capsys.readouterr().out
    assert "wrote voice" in out and f"--voice {voice}" in out
    assert [p.name for p in voice.iterdir()] == ["embedding.npy"]
    argv = ["voice", "prepare", "declared", str(tmp_path / "me.wav"), "-o", str(voice), "--json"]
    assert main(argv) == 2  # the folder is there now
    assert "not an empty folder" in capsys.readouterr().err


def test_voice_prepare_json_and_a_failure_leaves_no_folder(fixtures, tmp_path, capsys):
    write_wav(tmp_path / "me.wav", np.zeros(1600, np.float32), 16000)
    argv = ["voice", "prepare", "hosted", str(tmp_path / "me.wav"), "-o", str(tmp_path / "v")]
    assert main([*argv, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["result"] == {"files": ["embedding.npy"]}
    argv[-1] = str(tmp_path / "w")
    assert main([*argv, "--param", "mode=raise"]) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["me.wav", "v"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("stream", [Terminal, io.StringIO])
def test_progress_shows_after_the_delay_and_ends_with_a_last_line(stream):
    clock, out = Clock(), stream()
    progress = Progress(out, delay=0.5, every=0.1, every_line=0.1, clock=clock)
    progress(1, 4, "frames")  # before the delay: nothing
    progress.finish()
    assert out.getvalue() == ""
    for done in (2, 3):
        clock.now += 0.6
        progress(done, 4, "frames")
    clock.now += 0.6
    progress(5, None, "frames (at most 9)")
    progress.finish()
    text = out.getvalue()
    if stream is Terminal:  # one line redrawn in place, ended by the last one
        assert text.count("\n") == 1 and text.endswith("\n")
        assert text.split("\r")[-1].rstrip() == "done: 5 frames (at most 9) (1.8 s)"
        assert "[############------------]  50% 2/4 frames" in text
    else:
        assert text.splitlines() == [
            "progress 2/4 frames 50% (0.6 s)",
            "progress 3/4 frames 75% (1.2 s)",
            "progress 5 frames (at most 9) (1.8 s)",
            "done: 5 frames (at most 9) (1.8 s)",
        ]


def test_synth_to_stdout_through_a_real_process(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(HOST_FIXTURE_SITE), os.environ.get("PYTHONPATH", "")]),
        "MIZUOTO_PLUGINS": "mizuoto-fixture-host,mizuoto-engine-sine",
    }
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "synth", "sine", "-", "-o", "-"],
        input=b"hello from a pipe",
        capture_output=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert wav_bytes_ok(done.stdout)
    (tmp_path / "piped.wav").write_bytes(done.stdout)
    assert read_wav(tmp_path / "piped.wav").duration > 0
    assert b"wrote standard output" in done.stderr and b"timings:" in done.stderr


def test_progress_off_a_terminal_prints_large_counts_whole():
    clock, out = Clock(), io.StringIO()
    progress = Progress(out, delay=0.0, every_line=0.0, clock=clock)
    progress(6615000.0, 13230000.0, "samples")
    progress(13230000, None, "samples")
    progress(2.5, 10, "seconds")
    assert out.getvalue().splitlines() == [
        "progress 6615000/13230000 samples 50% (0.0 s)",
        "progress 13230000 samples (0.0 s)",
        "progress 2.5/10 seconds 25% (0.0 s)",
    ]
