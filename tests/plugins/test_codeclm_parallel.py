"""codeclm split over two ranks (attention and dense TP on gloo) from the command line.

With ``top_k = 1`` each frame's code is the argmax of the decoder's logits, which TP changes only
in rounding (the all-reduce adds in another order; below 1e-5 here, see docs/runtime/lm.md), so
the codes, and with them the replicated codec's audio, equal the single-rank run's.
"""

from __future__ import annotations

import subprocess
import sys

from mizuoto_sdk.cli import main

TEXT = "Two ranks, one voice."
SPLIT = [
    "--set",
    "engines.codeclm.parallel.dense.tp_size=2",
    "--set",
    "engines.codeclm.parallel.attention.tp_size=2",
]


def synth(out, *extra):
    return ["synth", "codeclm", TEXT, "-o", str(out), "--seed", "5", "--param", "top_k=1", *extra]


def test_codeclm_on_two_ranks_writes_the_single_rank_audio(tmp_path):
    # The codec's CPU output depends on torch's thread count: both runs use one thread per
    # worker (the single rank in a local worker), whatever this machine's cores.
    single, split = tmp_path / "single.wav", tmp_path / "split.wav"
    one_thread = ["--set", "engines.codeclm.deployment=local", "--set", "engines.codeclm.threads=1"]
    assert main(synth(single, *one_thread)) == 0
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "mizuoto_sdk.cli",
            *synth(split, *SPLIT, "--set", "engines.codeclm.threads=1"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert split.read_bytes() == single.read_bytes()


def test_a_split_codeclm_cannot_run_is_refused_naming_the_rule(tmp_path, capsys):
    # codeclm declares dense and attention; an expert split is not its to run
    code = main([*synth(tmp_path / "x.wav"), "--set", "engines.codeclm.parallel.moe.ep_size=2"])
    assert code == 2
    message = capsys.readouterr().err
    assert "moe" in message and "engines.codeclm.parallel" in message
    assert not (tmp_path / "x.wav").exists()


def test_a_tp_size_the_heads_do_not_divide_is_refused_before_any_rank_starts(tmp_path, capsys):
    split = [
        "--set",
        "engines.codeclm.parallel.dense.tp_size=3",
        "--set",
        "engines.codeclm.parallel.attention.tp_size=3",
    ]
    assert main([*synth(tmp_path / "x.wav"), *split]) == 2
    message = capsys.readouterr().err
    assert "[invalid_request]" in message  # from the engine's validate_parallel, not a worker
    assert "attention.tp_size=3 must divide the decoder's 4 attention heads" in message
