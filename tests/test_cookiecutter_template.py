"""The engine template: every option combination renders, installs and passes the contract.

Each combination of capabilities and uses_torch is rendered with cookiecutter, installed with pip
into one target folder (no dependencies, no index: the SDK is already here), found by the host
from there through PYTHONPATH, and put through the front ends an engine author uses:
``mizuoto engines``, ``mizuoto-contract``, the rendered project's own pytest, and ruff with this
repository's config.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

from mizuoto_contract.checks import ALL

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: pytest depends on tomli there
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "cookiecutter"
CHECK_IDS = [check.id for check in ALL]
CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@dataclass(frozen=True)
class Rendered:
    """One rendered project and the answers it was rendered with."""

    slug: str
    capabilities: str
    uses_torch: bool
    folder: Path

    @property
    def package(self) -> Path:
        return self.folder / "src" / f"mizuoto_engine_{self.slug.replace('-', '_')}"

    @property
    def convert(self) -> bool:
        return self.capabilities == "synthesize+convert"

    def sources(self) -> dict[str, str]:
        """Every rendered Python file, by its path in the project."""
        return {
            path.relative_to(self.folder).as_posix(): path.read_text()
            for folder in (self.folder / "src", self.folder / "tests")
            for path in sorted(folder.rglob("*.py"))
        }


# (engine id, capabilities, uses_torch): every combination of the template's two options.
COMBINATIONS = [
    (f"tpl-{capabilities.replace('+', '-')}-{'torch' if torch else 'numpy'}", capabilities, torch)
    for capabilities in ("synthesize", "synthesize+convert")
    for torch in (True, False)
]
IDS = [slug for slug, _, _ in COMBINATIONS]
# The convert combinations run their whole pytest, the contract through parametrize_contract
# included: their test files hold every test the others have. The synthesize-only ones leave out
# test_contract.py, whose checks the CLI test runs for every combination.
FULL_PYTEST = {slug for slug, capabilities, _ in COMBINATIONS if "convert" in capabilities}
# pytest -q's last line when everything collected passed (or was deselected).
SUMMARY = re.compile(
    r"(?P<passed>\d+) passed(, (?P<skipped>\d+) skipped)?(, (?P<deselected>\d+) deselected)?"
    r"(, \d+ warnings?)?"
    r" in [\d.]+s( \([\d:]+\))?"
)
# Given to the numpy combinations: a description too long for one line must still lint clean.
LONG_DESCRIPTION = (
    'Speaks text as "tones" and reshapes recordings, a deliberately long description that cannot '
    "fit on one line of the manifest or the package docstring, with a back\\slash in it."
)


def render(output: Path, **answers: object) -> Path:
    """cookiecutter without prompts; its replay file goes to ``output``, not the home folder."""
    config = output / ".cookiecutter" / "config.yaml"
    config.parent.mkdir(exist_ok=True)
    folders = {"replay_dir": str(config.parent / "replay"), "cookiecutters_dir": str(config.parent)}
    config.write_text(yaml.safe_dump(folders))
    folder = cookiecutter(
        str(TEMPLATE),
        no_input=True,
        extra_context=answers,
        output_dir=str(output),
        config_file=str(config),
    )
    return Path(folder)


def child_environment(site: Path) -> dict[str, str]:
    """This environment with ``site`` first on PYTHONPATH, and nothing that narrows plugins."""
    dropped = ("MIZUOTO_PLUGINS", "PYTEST_ADDOPTS")
    environment = {k: v for k, v in os.environ.items() if k not in dropped}
    path = [str(site), *filter(None, environment.get("PYTHONPATH", "").split(os.pathsep))]
    return {**environment, "PYTHONPATH": os.pathsep.join(path)}


def run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


@pytest.fixture(scope="module")
def projects(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Rendered]:
    output = tmp_path_factory.mktemp("rendered")
    return {
        slug: Rendered(
            slug,
            capabilities,
            torch,
            render(
                output,
                slug=slug,
                capabilities=capabilities,
                uses_torch=torch,
                **({} if torch else {"description": LONG_DESCRIPTION}),
            ),
        )
        for slug, capabilities, torch in COMBINATIONS
    }


@pytest.fixture(scope="module")
def site(projects: dict[str, Rendered], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """All four projects installed, as pip installs them, into one folder the host searches."""
    target = tmp_path_factory.mktemp("site")
    options = ["--no-deps", "--no-build-isolation", "--no-index", "--no-cache-dir", "--quiet"]
    folders = [str(project.folder) for project in projects.values()]
    command = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check"]
    done = run([*command, *options, "--target", str(target), *folders], cwd=target)
    assert done.returncode == 0, done.stdout + done.stderr
    return target


@pytest.fixture(params=IDS)
def project(request: pytest.FixtureRequest, projects: dict[str, Rendered]) -> Rendered:
    return projects[request.param]


def test_the_layout_is_a_src_layout_distribution(project):
    assert project.folder.name == f"mizuoto-engine-{project.slug}"
    expected = [
        "pyproject.toml",
        "README.md",
        "LICENSE",
        ".gitignore",
        ".github/workflows/ci.yml",
        "scripts/ci.sh",
        "tests/test_contract.py",
        "tests/test_registration.py",
        "tests/test_engine.py",
    ]
    modules = ["__init__.py", "plugin.py", "engine.py", "model.py", "py.typed"]
    missing = [p for p in expected if not (project.folder / p).is_file()]
    missing += [m for m in modules if not (project.package / m).is_file()]
    assert not missing, f"not rendered: {missing}"
    leftovers = []
    for path in sorted(project.folder.rglob("*")):
        if path.is_file():
            text = re.sub(r"\$\{\{[^}]*\}\}", "", path.read_text())  # GitHub's own expressions
            if any(tag in text for tag in ("{{", "}}", "{%", "%}", "{#")):
                leftovers.append(path.relative_to(project.folder).as_posix())
    assert not leftovers, f"unrendered Jinja in {leftovers}"


def test_the_pyproject_declares_the_entry_point_dependencies_and_test_extra(project):
    config = tomllib.loads((project.folder / "pyproject.toml").read_text())
    meta = config["project"]
    package = project.package.name
    assert meta["name"] == project.folder.name
    assert config["project"]["entry-points"]["mizuoto.engines"] == {
        project.slug: f"{package}.plugin"
    }
    assert meta["optional-dependencies"] == {"test": ["pytest>=8", "mizuoto-contract>=0.1,<0.2"]}
    if project.uses_torch:
        assert meta["dependencies"] == ["mizuoto-sdk[torch]>=0.1,<0.2"]
    else:
        assert meta["dependencies"] == ["mizuoto-sdk>=0.1,<0.2", "numpy>=1.24"]
    assert config["tool"]["setuptools"]["package-data"] == {package: ["py.typed"]}
    if not project.uses_torch:
        assert meta["description"] == LONG_DESCRIPTION


def _imports(source: str) -> list[tuple[int, str]]:
    """(column, module) of every import: column 0 is module level."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.col_offset, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.col_offset, node.module))
    return found


def test_the_plugin_module_and_the_engine_module_leave_torch_unimported(project):
    plugin = _imports((project.package / "plugin.py").read_text())
    assert [module for _, module in plugin] == ["mizuoto_sdk"]
    engine = {
        m for column, m in _imports((project.package / "engine.py").read_text()) if not column
    }
    assert engine <= {"__future__", "collections.abc", "typing", "mizuoto_sdk"}
    everywhere = {
        module.split(".")[0]
        for path, text in project.sources().items()
        if path.startswith("src/")
        for _, module in _imports(text)
    }
    assert ("torch" in everywhere) == project.uses_torch


def test_convert_code_is_there_exactly_when_chosen(project):
    sources = project.sources()
    mentions = [path for path, text in sources.items() if "convert" in text.lower()]
    if project.convert:
        assert "def convert(" in sources[f"src/{project.package.name}/engine.py"]
        assert (
            'capabilities=["synthesize", "convert"]' in (project.package / "plugin.py").read_text()
        )
        assert "tests/test_engine.py" in mentions
    else:
        assert mentions == [], f"convert code rendered although not chosen: {mentions}"


def test_the_ci_workflow_runs_the_ci_script_on_every_python(project):
    workflow = yaml.safe_load((project.folder / ".github/workflows/ci.yml").read_text())
    [job] = workflow["jobs"].values()
    assert [step["run"] for step in job["steps"] if "run" in step] == ["bash scripts/ci.sh"]
    assert job["strategy"]["matrix"]["python-version"]
    with_python = [s for s in job["steps"] if s.get("uses", "").startswith("actions/setup-python")]
    assert with_python[0]["with"]["python-version"] == "${{ matrix.python-version }}"


def test_the_ci_script_installs_cpu_torch_then_the_wheels_then_the_engine_then_tests(project):
    script = (project.folder / "scripts/ci.sh").read_text()
    lines = [line.strip() for line in script.splitlines() if line and not line.startswith("#")]

    def first(*words: str) -> int:
        return next(i for i, line in enumerate(lines) if all(w in line for w in words))

    wheels = first("mizuoto_sdk-*.whl", "mizuoto_contract-*.whl")
    engine = first('".[test]"')
    order = [wheels, engine, first("pytest"), first("mizuoto-contract", project.slug)]
    if project.uses_torch:
        order.insert(0, first("torch --index-url", CPU_INDEX))
    else:
        assert "torch" not in script
    assert order == sorted(order)
    assert (project.folder / "scripts/ci.sh").stat().st_mode & 0o100, "not executable"


@pytest.mark.parametrize("own_config", [False, True], ids=["root-config", "own-config"])
def test_the_rendered_sources_pass_ruff(project, own_config):
    config = [] if own_config else ["--config", str(ROOT / "pyproject.toml")]
    for command in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        done = run([sys.executable, "-m", "ruff", *command, *config, "."], cwd=project.folder)
        assert done.returncode == 0, f"ruff {' '.join(command)}:\n{done.stdout}{done.stderr}"


def test_the_host_lists_every_installed_combination_as_ok(site, tmp_path):
    done = run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "engines", "--json"],
        cwd=tmp_path,
        env=child_environment(site),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["id"]: row for row in json.loads(done.stdout)}
    for slug, capabilities, torch in COMBINATIONS:
        row = rows[slug]
        assert (row["status"], row["distribution"]) == ("ok", f"mizuoto-engine-{slug}")
        assert row["capabilities"] == capabilities.split("+")
        assert row["devices"] == (["cpu", "cuda", "mps", "xpu"] if torch else ["cpu"])
        assert row["dtypes"] == (["float32", "bfloat16", "float16"] if torch else ["float32"])
    script = (
        "import json; from mizuoto_sdk.host import discover; "
        "print(json.dumps({r.id: r.manifest.description for r in discover().records() if r.ok}))"
    )
    done = run([sys.executable, "-c", script], cwd=tmp_path, env=child_environment(site))
    assert done.returncode == 0, done.stdout + done.stderr
    descriptions = json.loads(done.stdout.strip().splitlines()[-1])
    for slug, _, torch in COMBINATIONS:
        if not torch:  # rendered over several lines of the manifest, read back as one string
            assert descriptions[slug] == LONG_DESCRIPTION


@pytest.mark.slow
def test_mizuoto_contract_passes_every_check_for_every_combination(site, tmp_path):
    report = tmp_path / "report.json"
    done = run(
        [sys.executable, "-m", "mizuoto_contract.cli", *IDS, "--json", str(report)],
        cwd=tmp_path,
        env=child_environment(site),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    engines = json.loads(report.read_text())["engines"]
    assert [e["engine"] for e in engines] == IDS
    for engine in engines:
        statuses = {check["id"]: check["status"] for check in engine["checks"]}
        assert list(statuses) == CHECK_IDS
        skipped_for_capability = {c["id"] for c in engine["checks"] if c["capability_skip"]}
        failed = {
            k: v for k, v in statuses.items() if v != "passed" and k not in skipped_for_capability
        }
        assert not failed, f"{engine['engine']}: {failed}\n{done.stdout}"


@pytest.mark.slow
def test_the_rendered_projects_own_tests_pass(project, site):
    full = project.slug in FULL_PYTEST
    options = [] if full else ["--deselect", "tests/test_contract.py"]
    done = run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *options],
        cwd=project.folder,
        env=child_environment(site),
    )
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0, done.stdout + done.stderr
    counts = SUMMARY.fullmatch(summary)
    assert counts, f"expected only passes, got: {summary}"
    contract = len(CHECK_IDS)
    # the only skips: the checks of streamed text input, which the template does not declare
    optional = len([i for i in CHECK_IDS if i.startswith("text_input.")]) if full else 0
    assert int(counts["skipped"] or 0) == optional, done.stdout
    assert int(counts["deselected"] or 0) == (0 if full else contract)
    assert int(counts["passed"]) >= (contract - optional if full else 0) + 3 + 5  # registration


def test_the_defaults_render_the_documented_project(tmp_path):
    folder = render(tmp_path)
    assert folder.name == "mizuoto-engine-chime"  # not hum: the README walks through that one
    meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    assert meta["authors"] == [{"name": "Your Name", "email": "you@example.com"}]
    assert meta["license-files"] == ["LICENSE"]
    plugin = (folder / "src/mizuoto_engine_chime/plugin.py").read_text()
    assert 'id="chime"' in plugin and 'capabilities=["synthesize"]' in plugin
    assert '"mizuoto_engine_chime.engine:ChimeEngine"' in plugin
    assert 'devices=["cpu", "cuda", "mps", "xpu"]' in plugin
    readme = (folder / "README.md").read_text()
    assert "mizuoto-contract chime" in readme
    assert f"pip install torch --index-url {CPU_INDEX}" in readme
    assert "Apache License" in (folder / "LICENSE").read_text()


@pytest.mark.parametrize(
    ("license", "phrase"),
    [
        ("MIT", "Permission is hereby granted, free of charge"),
        ("BSD-3-Clause", "Redistribution and use in source and binary forms"),
        ("Apache-2.0", "Apache License\n                           Version 2.0, January 2004"),
    ],
)
def test_the_license_choice_writes_its_text_and_its_spdx_id(tmp_path, license, phrase):
    folder = render(tmp_path, license=license, author="Ada Example", email="")
    text = (folder / "LICENSE").read_text()
    assert phrase in text
    if license != "Apache-2.0":  # Apache's text names the holder in each file's notice instead
        assert re.search(r"^Copyright (\(c\) )?\d{4} Ada Example$", text, re.MULTILINE), text
    meta = tomllib.loads((folder / "pyproject.toml").read_text())["project"]
    assert meta["license"] == license
    assert meta["authors"] == [{"name": "Ada Example"}]  # no email given, none written


REFUSALS = [
    ({"slug": "Bad Slug"}, "slug 'Bad Slug' is not an engine id"),
    ({"slug": "mizuoto-engine-x"}, "slug 'mizuoto-engine-x': give the engine id alone"),
    ({"project_slug": "my-engine"}, "project_slug 'my-engine': expected 'mizuoto-engine-'"),
]
REFUSAL_IDS = ["not-an-id", "full-name", "wrong-prefix"]


@pytest.mark.parametrize(("answers", "message"), REFUSALS, ids=REFUSAL_IDS)
def test_answers_the_host_could_not_use_are_refused_before_writing(tmp_path, answers, message):
    with pytest.raises(FailedHookException) as raised:
        render(tmp_path, **answers)
    assert str(raised.value).startswith(f"error: {message}")
    assert str(raised.value).endswith("nothing was written")
    assert not list(tmp_path.glob("mizuoto-engine-*")), "a refused project was left behind"


@pytest.mark.parametrize(("answers", "message"), REFUSALS, ids=REFUSAL_IDS)
def test_the_cookiecutter_command_prints_one_message_for_a_refusal(tmp_path, answers, message):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"replay_dir": str(tmp_path / "replay")}))
    given = [f"{name}={value}" for name, value in answers.items()]
    command = [sys.executable, "-m", "cookiecutter", "--no-input", "--config-file", str(config)]
    done = run([*command, "-o", str(tmp_path), str(TEMPLATE), *given], cwd=tmp_path)
    assert done.returncode == 1
    printed = (done.stdout + done.stderr).strip().splitlines()
    assert len(printed) == 1, printed  # no traceback, no second message
    assert printed[0].startswith(f"error: {message}"), printed
    assert not list(tmp_path.glob("mizuoto-engine-*")), "a refused project was left behind"
