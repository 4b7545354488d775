"""The distributions install outside this repository.

Every distribution ships its LICENSE; ``scripts/build.sh`` builds a wheel and an sdist of each;
and a project rendered from the template passes its own CI script (``scripts/ci.sh``: CPU torch,
the SDK and contract wheels, the engine, ruff, pytest, ``mizuoto-contract``) in a fresh virtual
environment that takes mizuoto-sdk and mizuoto-contract from those wheels. The environment sees
this interpreter's packages (torch, numpy, pytest, ruff), and pip runs with no index, so nothing
reaches beyond the machine.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from cookiecutter.main import cookiecutter

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
# folder in this repository -> the import package its distribution ships
DISTRIBUTIONS = {
    ".": "mizuoto_sdk",
    "contract_tests": "mizuoto_contract",
    "plugins/mizuoto-engine-sine": "mizuoto_engine_sine",
    "plugins/mizuoto-engine-codeclm": "mizuoto_engine_codeclm",
}
APACHE = "Apache License\n                           Version 2.0, January 2004"


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}{done.stderr}"
    return done.stdout


@pytest.mark.parametrize("folder", list(DISTRIBUTIONS))
def test_every_distribution_declares_and_holds_the_apache_license(folder):
    project = tomllib.loads((ROOT / folder / "pyproject.toml").read_text())["project"]
    assert (project["license"], project["license-files"]) == ("Apache-2.0", ["LICENSE"])
    assert APACHE in (ROOT / folder / "LICENSE").read_text()


@pytest.fixture(scope="module")
def wheels(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every distribution's wheel and sdist, built by scripts/build.sh into a folder of its own."""
    out = tmp_path_factory.mktemp("dist")
    run(["bash", str(ROOT / "scripts" / "build.sh"), str(out)], cwd=ROOT)
    return out


def _sources(package: Path) -> set[str]:
    return {p.relative_to(package.parent).as_posix() for p in package.rglob("*.py")}


@pytest.mark.slow
@pytest.mark.parametrize(("folder", "name"), list(DISTRIBUTIONS.items()))
def test_build_writes_a_wheel_and_an_sdist_holding_the_license(wheels, folder, name):
    [wheel] = wheels.glob(f"{name}-*.whl")
    [sdist] = wheels.glob(f"{name}-*.tar.gz")
    version = wheel.name.split("-")[1]
    with zipfile.ZipFile(wheel) as archive:
        files = set(archive.namelist())
        metadata = archive.read(f"{name}-{version}.dist-info/METADATA").decode()
        license_text = archive.read(f"{name}-{version}.dist-info/licenses/LICENSE").decode()
    assert APACHE in license_text
    assert "License-Expression: Apache-2.0" in metadata and "License-File: LICENSE" in metadata
    # Exactly the modules in the source tree: nothing left over from an earlier build.
    package = ROOT / folder / ("" if folder == "." else "src") / name
    assert {f for f in files if f.endswith(".py") and f.startswith(f"{name}/")} == _sources(package)
    with tarfile.open(sdist) as archive:
        assert f"{name}-{version}/LICENSE" in archive.getnames()
    if name == "mizuoto_engine_codeclm":  # its shipped weights are package data
        assert f"{name}/weights/model.safetensors" in files


def _fresh_environment(folder: Path) -> Path:
    """A virtual environment without pip of its own that sees this interpreter's packages."""
    options = ["--system-site-packages", "--without-pip"]
    run([sys.executable, "-m", "venv", *options, str(folder)], cwd=ROOT)
    if sys.prefix != sys.base_prefix:  # run from a virtual environment: see its packages too
        [site] = (folder / "lib").glob("python*/site-packages")
        outer = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
        lines = [f"import site; site.addsitedir({path!r})" for path in sorted(outer)]
        (site / "outer_environment.pth").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="the CI script is a bash script")
def test_the_templates_ci_script_passes_on_the_built_wheels_in_a_fresh_venv(wheels, tmp_path):
    config = tmp_path / "cookiecutter.yaml"
    config.write_text(yaml.safe_dump({"replay_dir": str(tmp_path / "replay")}))
    project = Path(
        cookiecutter(str(ROOT / "cookiecutter"), no_input=True, output_dir=str(tmp_path),
                     config_file=str(config))
    )  # fmt: skip
    venv = _fresh_environment(tmp_path / "venv")
    dropped = ("PYTHONPATH", "MIZUOTO_PLUGINS", "PYTEST_ADDOPTS", "PYTHONHOME")
    env = {k: v for k, v in os.environ.items() if k not in dropped}
    env.update(
        PATH=os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]),
        VIRTUAL_ENV=str(venv),
        MIZUOTO_WHEELS=str(wheels),
        PIP_NO_INDEX="1",
        PIP_NO_BUILD_ISOLATION="0",  # pip reads "0" here as: build with the packages present
    )
    output = run(["bash", "scripts/ci.sh"], cwd=project, env=env)
    # its pytest: every check passes, or skips for a capability the template does not declare
    assert re.search(r"^=+ \d+ passed(, \d+ skipped)? in [\d.]+s", output, re.MULTILINE), output
    [contract] = re.findall(r"^(\d+) passed, (\d+) failed, .*; (\d+) ran$", output, re.MULTILINE)
    assert contract[1] == "0" and contract[0] == contract[2], output
    # The SDK, the suite and the engine ran from the environment, not from this checkout.
    script = (
        "import mizuoto_sdk, mizuoto_contract, mizuoto_engine_chime as e; "
        "print(mizuoto_sdk.__file__, mizuoto_contract.__file__, e.__file__, sep='\\n')"
    )
    imported = run([str(venv / "bin" / "python"), "-c", script], cwd=tmp_path, env=env)
    assert all(Path(p).is_relative_to(venv) for p in imported.split()), imported
