"""Engines that need programs and libraries, and the torch build doctor checks and fixes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from mizuoto_runtime.devices import probe
from mizuoto_runtime.devices.probe import describe_build, device_missing
from mizuoto_sdk import EngineError, EngineManifest, Library, ModelEntry, Program
from mizuoto_sdk.cli import main
from mizuoto_sdk.host import Discovery, RuntimeService
from mizuoto_sdk.host.programs import missing_requirements

DISTRIBUTION = "mizuoto-fixture-programs"
MISSING = "mizuoto-fixture-no-such-program"


@pytest.fixture
def programs(plugin_site, monkeypatch):
    """The fixture distribution's four engines, and no other, as the command finds them."""
    path = plugin_site("programs")
    monkeypatch.setenv("MIZUOTO_PLUGINS", DISTRIBUTION)
    return path


def manifest(**fields):
    return EngineManifest(
        id="x",
        implementation="x.engine:X",
        models=[ModelEntry("m")],
        capabilities=["call"],
        **fields,
    )


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: Program("", install="apt install x"), "Program.name"),
        (lambda: Program("espeak ng", install="apt install x"), "Program.name"),
        (lambda: Program("espeak-ng", install=" "), "Program.install"),
        (lambda: Program("espeak-ng", install="x", probe="checks.espeak_ok"), "Program.probe"),
        (lambda: Library("sndfile", install=None), "Library.install"),
        (lambda: manifest(programs=["espeak-ng"]), "programs: expected Program values"),
        (lambda: manifest(libraries=[Program("sh", install="x")]), "libraries: expected Library"),
        (
            lambda: manifest(programs=[Program("sh", install="a"), Program("sh", install="b")]),
            "programs: ['sh', 'sh'] names one twice",
        ),
    ],
)
def test_a_bad_declaration_names_the_field(make, names):
    with pytest.raises(ValueError, match="^" + names.replace("[", r"\[").replace("(", r"\(")):
        make()


def test_a_declaration_keeps_what_it_was_given():
    needs = manifest(
        programs=Program("ffmpeg", install="apt install ffmpeg", probe="pkg.checks:ffmpeg_ok"),
        libraries=[Library("sndfile", install="apt install libsndfile1")],
    )
    assert needs.programs == (Program("ffmpeg", "apt install ffmpeg", "pkg.checks:ffmpeg_ok"),)
    assert needs.libraries[0].name == "sndfile"
    assert manifest().programs == () and manifest().libraries == ()


@pytest.mark.parametrize(
    ("probe_name", "reason"),
    [
        ("fine", None),
        ("espeak_ok", "espeak-ng 1.49 is too old; 1.51 or newer is needed"),
        ("raises", "failed: OSError: cannot run espeak-ng --version"),
        ("answers_a_number", "returned 3; expected None or a reason"),
        ("nowhere", "failed: AttributeError"),
    ],
)
def test_a_probe_replaces_the_path_lookup(programs, probe_name, reason):
    check = f"mizuoto_fixture_programs.checks:{probe_name}"
    # "sh" is on PATH: only the probe can make it missing.
    missing = missing_requirements(manifest(programs=[Program("sh", install="i", probe=check)]))
    if reason is None:
        assert missing == []
    else:
        (entry,) = missing
        assert entry["kind"] == "program" and entry["name"] == "sh" and entry["install"] == "i"
        assert reason in entry["reason"]


def test_engines_lists_what_each_engine_lacks_with_its_install_command(programs, capsys):
    assert main(["engines", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["has-sh"]["missing_programs"] == []
    assert rows["lacks-program"]["missing_programs"] == [
        {
            "kind": "program",
            "name": MISSING,
            "install": "apt install espeak-ng",
            "reason": "not found on PATH",
        }
    ]
    assert rows["lacks-library"]["missing_programs"][0]["kind"] == "library"
    assert main(["engines"]) == 0
    out = capsys.readouterr().out
    assert (
        f"lacks-program: needs program {MISSING} (not found on PATH): apt install espeak-ng" in out
    )
    assert "has-sh: needs" not in out


def test_doctor_fails_for_an_engine_that_cannot_run_and_passes_for_one_that_can(programs, capsys):
    assert main(["doctor", "has-sh"]) == 0
    assert "engine has-sh: available" in capsys.readouterr().out
    assert main(["doctor", "lacks-library"]) == 1
    assert (
        "engine lacks-library: needs library mizuoto_fixture_no_such_lib (shared library not "
        "found): apt install libnothing1"
    ) in capsys.readouterr().out
    assert main(["doctor", "--json"]) == 1  # without a name: any engine that cannot run fails it
    engines = {e["id"]: e for e in json.loads(capsys.readouterr().out)["engines"]}
    assert {k: e["available"] for k, e in engines.items()} == {
        "has-sh": True,
        "lacks-program": False,
        "lacks-library": False,
        "probed": False,
    }
    assert engines["probed"]["status"] == "ok"
    assert "too old" in engines["probed"]["missing_programs"][0]["reason"]


def test_doctor_in_a_process_prints_the_install_command_and_exits_1(programs):
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "doctor", "lacks-program"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(programs)},
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert f"needs program {MISSING} (not found on PATH): apt install espeak-ng" in done.stdout


@pytest.mark.parametrize(
    ("engine_id", "reason", "install"),
    [
        ("lacks-program", "program_missing", ["apt install espeak-ng"]),
        ("lacks-library", "library_missing", ["apt install libnothing1"]),
    ],
)
def test_loading_fails_with_what_is_missing(programs, engine_id, reason, install):
    service = RuntimeService(discovery=Discovery(path=programs, selection=None))
    engine = service.engine(engine_id)
    with pytest.raises(EngineError) as caught:
        engine.load()
    assert caught.value.code == "engine_unavailable"
    assert caught.value.detail["reason"] == reason
    assert caught.value.detail["install"] == install
    assert install[0] in str(caught.value)
    assert engine.state == "stopped"  # not crashed: install it and load again


def test_an_engine_whose_programs_are_there_loads_and_runs(programs):
    service = RuntimeService(discovery=Discovery(path=programs, selection=None))
    model = service.engine("has-sh").load()
    assert sum(len(c.samples) for c in model.synthesize("hi")) == 160


# The torch build: fed as probe results, so that no GPU (and no other torch) is needed.


@pytest.mark.parametrize(
    ("version", "build", "machine", "install"),
    [
        (  # a CUDA build on a machine without a GPU: the same version, from the CPU index
            "2.5.1+cu124",
            "cuda 12.4",
            [],
            "pip uninstall -y torch && "
            "pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cpu",
        ),
        (  # the reverse
            "2.8.0+cpu",
            "cpu",
            ["cuda"],
            "pip uninstall -y torch && "
            "pip install torch==2.8.0 --index-url https://download.pytorch.org/whl/cu128",
        ),
        (  # a release older than the cu128 wheels
            "2.5.1+cpu",
            "cpu",
            ["cuda"],
            "pip uninstall -y torch && "
            "pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cu124",
        ),
        (  # a nightly: no such pin on the release index
            "2.9.0.dev20250101+cpu",
            "cpu",
            ["cuda"],
            "pip uninstall -y torch && "
            "pip install torch --index-url https://download.pytorch.org/whl/cu128",
        ),
        (
            None,
            None,
            ["cuda"],
            "pip install torch --index-url https://download.pytorch.org/whl/cu128",
        ),
        ("2.8.0+cu128", "cuda 12.8", ["cuda"], None),
        ("2.8.0", "cpu", [], None),
    ],
)
def test_the_install_that_fixes_the_torch_build_replaces_it(version, build, machine, install):
    described = describe_build(version, build, machine)
    assert described["install"] == install
    assert described["matches_machine"] is (install is None)


@pytest.mark.parametrize(
    ("build", "machine", "cause", "says"),
    [
        ("cpu", ["cuda"], "torch_build", "has no cuda: pip uninstall -y torch && pip install"),
        ("cuda 12.4", [], "no_device", "this machine has no cuda device (torch 2.5.1"),
        ("cpu", [], "no_device", "has no cuda either"),
        ("cuda 12.4", ["cuda"], "not_visible", "CUDA_VISIBLE_DEVICES"),
    ],
)
def test_a_missing_device_says_whether_torch_or_the_machine_lacks_it(build, machine, cause, says):
    found, sentence = device_missing("cuda:1", describe_build("2.5.1", build, machine))
    assert found == cause
    assert says in sentence


def test_doctor_flags_a_cuda_build_on_a_machine_without_a_gpu(programs, monkeypatch, capsys):
    monkeypatch.setattr(
        probe, "torch_build", lambda: describe_build("2.5.1+cu124", "cuda 12.4", [])
    )
    assert main(["doctor", "has-sh"]) == 0  # flagged, but the engine still runs (on the CPU)
    out = capsys.readouterr().out
    assert "torch: 2.5.1+cu124, built for cuda 12.4" in out
    assert (
        "does not match this machine: it is built for cuda 12.4 but this machine has no GPU" in out
    )
    assert (
        "replace it: pip uninstall -y torch && "
        "pip install torch==2.5.1 --index-url https://download.pytorch.org/whl/cpu"
    ) in out


def test_a_device_torch_cannot_open_says_why(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    service = RuntimeService(discovery=Discovery(selection=frozenset({"mizuoto-engine-sine"})))
    with pytest.raises(EngineError) as caught:
        service.engine("sine", "cuda").load()
    assert caught.value.code == "compute_unavailable"
    assert caught.value.detail["reason"] == "device_missing"
    cause, sentence = device_missing("cuda", probe.torch_build())
    assert caught.value.detail["cause"] == cause
    assert sentence in str(caught.value)
