"""The README's five-minute engine, built from its own code blocks, installs and synthesizes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_the_walkthrough_engine_works(tmp_path):
    blocks = re.findall(r"```(\w+)\n(.*?)```", README.read_text(), re.S)
    toml = [body for lang, body in blocks if lang == "toml"]
    python = [body for lang, body in blocks if lang == "python"]
    assert len(toml) == 1 and len(python) == 2, "the walkthrough's code blocks changed shape"
    project = tmp_path / "mizuoto-engine-hum"
    package = project / "mizuoto_engine_hum"
    package.mkdir(parents=True)
    assert "[build-system]" in toml[0], "the walkthrough shows the whole pyproject.toml"
    (project / "pyproject.toml").write_text(toml[0])
    (package / "__init__.py").write_text("")
    (package / "plugin.py").write_text(python[0])
    (package / "engine.py").write_text(python[1])
    site = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(site),
            str(project),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    mizuoto = [sys.executable, "-m", "mizuoto_sdk.cli"]
    listed = subprocess.run(
        [*mizuoto, "engines"], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    assert any(
        line.split()[:4] == ["hum", "mizuoto-engine-hum", "0.1.0", "ok"]
        for line in listed.stdout.splitlines()
    ), listed.stdout
    out = tmp_path / "hum.wav"
    synth = subprocess.run(
        [*mizuoto, "synth", "hum", "one two", "-o", str(out), "--seed", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert synth.returncode == 0, synth.stderr
    assert "2 chunks" in synth.stdout and out.stat().st_size > 44
    refused = subprocess.run(
        [
            sys.executable,
            "-c",
            "from mizuoto_sdk.host import EngineRequest, RuntimeService\n"
            "model = RuntimeService().load('hum')\n"
            "try:\n"
            "    list(model.synthesize('one', EngineRequest(params={'loudness': 2})))\n"
            "except Exception as error:\n"
            "    print(error.code, error.detail['field'])\n",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert refused.stdout.split() == ["invalid_request", "params.loudness"], refused.stdout
    contract = subprocess.run(
        [sys.executable, "-m", "mizuoto_contract", "hum"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert contract.returncode == 0, contract.stdout[-3000:] + contract.stderr[-3000:]
    assert " 0 failed" in contract.stdout, contract.stdout[-2000:]
