"""Discovery against real fixture distributions: each plugin isolated, every failure explained."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from mizuoto_sdk import (
    Engine,
    EngineManifest,
    EngineNotFound,
    EngineUnavailable,
    ModelEntry,
    hookimpl,
)
from mizuoto_sdk.host import Discovery

# Real distributions of plugins and engines that misbehave on purpose (see the package docstrings):
# tests/sdk/plugin_sites holds one site folder per case (the ``plugin_site`` fixture installs them),
# fixture_site holds mizuoto-fixture-faults.
FIXTURE_SITE = Path(__file__).parent / "fixture_site"


@pytest.fixture
def discovery_of(plugin_site):
    """``discovery_of("good", "twins")``: a Discovery of those case folders only, all selected."""
    return lambda *cases: Discovery(path=plugin_site(*cases), selection=None)


def by_id(discovery: Discovery) -> dict:
    return {r.id: r for r in discovery.records()}


def test_a_good_plugin_lists_its_manifest_without_importing_the_engine(discovery_of):
    record = by_id(discovery_of("good"))["good"]
    assert record.status == "ok" and record.error is None
    assert (record.distribution, record.version) == ("mizuoto-fixture-good", "2.3")
    assert record.manifest.devices == ("cpu",)
    assert record.manifest.models[0].id == "a"
    assert "mizuoto_fixture_good.plugin" in sys.modules
    assert "mizuoto_fixture_good.engine" not in sys.modules  # listing reads manifests only


@pytest.mark.parametrize(
    ("entry_point", "reason"),
    [
        ("raises", "RuntimeError: no such backend"),
        ("exits", "SystemExit"),
        ("needs-missing", "ModuleNotFoundError"),
    ],
)
def test_a_plugin_that_fails_to_import_is_failed_and_the_others_still_load(
    discovery_of, entry_point, reason
):
    records = by_id(discovery_of("good", "import_fails"))
    assert records["good"].status == "ok"
    assert records[entry_point].status == "failed"
    assert records[entry_point].distribution == "mizuoto-fixture-import-fails"
    assert reason in records[entry_point].error
    assert "import failed" in records[entry_point].error


@pytest.mark.parametrize(
    ("entry_point", "reasons"),
    [
        ("typo", ["mizuoto_engine", "did you mean 'mizuoto_engines'"]),
        ("unmarked", ["implements no Mizuoto hook", "@mizuoto_sdk.hookimpl"]),
        ("unknown-argument", ["registry"]),
        ("returns-dict", ["expected a list of EngineManifest"]),
        ("returns-strings", ["expected a list of EngineManifest"]),
        ("raises-keyerror", ["mizuoto_engines raised KeyError"]),
        ("bad-id", ["EngineManifest.id"]),
        ("unknown-device", ["devices: unknown ['tpu']"]),
    ],
)
def test_a_wrong_hook_is_failed_with_the_reason(discovery_of, entry_point, reasons):
    """Misspelt (check_pending suggests the name), unmarked, wrong arguments, garbage returned."""
    records = by_id(discovery_of("good", "bad_hooks"))
    assert records["good"].status == "ok"
    record = records[entry_point]
    assert record.status == "failed" and record.distribution == "mizuoto-fixture-bad-hooks"
    for reason in reasons:
        assert reason in record.error


def test_a_newer_major_api_version_is_incompatible_and_names_what_it_needs(discovery_of):
    discovery = discovery_of("api_versions")
    record = by_id(discovery)["future"]
    assert record.status == "incompatible"
    assert "2.0" in record.error and "API 1.x" in record.error
    with pytest.raises(EngineUnavailable, match="incompatible"):
        discovery.get_engine("future")


def test_a_newer_minor_api_version_still_loads(discovery_of):
    discovery = discovery_of("api_versions")
    assert by_id(discovery)["minor"].status == "ok"
    assert discovery.get_engine("minor").__name__ == "Good"


def test_two_distributions_with_one_engine_id_conflict_and_name_each_other(discovery_of):
    discovery = discovery_of("twins")
    records = [r for r in discovery.records() if r.id == "twin"]
    first, second = "mizuoto-fixture-twin-first", "mizuoto-fixture-twin-second"
    assert sorted(r.distribution for r in records) == [first, second]
    assert all(r.status == "conflict" for r in records)
    first_record = next(r for r in records if r.distribution == first)
    assert second in first_record.error
    with pytest.raises(EngineUnavailable, match="conflict"):
        discovery.get_engine("twin")


def test_mizuoto_plugins_selects_distributions(plugin_site, monkeypatch):
    path = plugin_site("selection")  # distributions mizuoto-fixture-one and Mizuoto_Fixture_Two

    def listed() -> set[str]:
        return {r.id for r in Discovery(path=path).records()}

    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    assert listed() == {"one", "two"}
    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    assert listed() == set()
    monkeypatch.setenv("MIZUOTO_PLUGINS", "mizuoto-fixture-one")
    assert listed() == {"one"}
    monkeypatch.setenv("MIZUOTO_PLUGINS", " mizuoto-fixture-two , nothing-else")
    assert listed() == {"two"}


def test_get_engine_imports_the_class_and_an_unknown_id_lists_the_known_ones(discovery_of):
    discovery = discovery_of("good")
    cls = discovery.get_engine("good")
    assert issubclass(cls, Engine) and cls.__name__ == "Good"
    assert "mizuoto_fixture_good.engine" in sys.modules
    with pytest.raises(EngineNotFound) as caught:
        discovery.get_engine("nope")
    assert caught.value.code == "engine_not_found"
    assert "known engines: good" in str(caught.value)
    assert caught.value.detail["known"] == ["good"]


def test_get_engine_never_returns_a_plugin_that_failed_to_import(discovery_of):
    with pytest.raises(EngineNotFound):  # a failed plugin never named an engine
        discovery_of("import_fails").get_engine("raises")


@pytest.mark.parametrize(
    ("engine_id", "reason"),
    [
        ("devices-disagree", "DEVICES"),
        ("dtypes-disagree", "DTYPES"),
        ("extras-disagree", "EXTRAS"),
        ("not-an-engine", "not a subclass of mizuoto_sdk.Engine"),
        ("final", "(TypeError: final); set DEVICES, DTYPES and EXTRAS on the class"),
        ("raises-on-import", "OSError: missing weights"),
        ("missing-class", "AttributeError"),
    ],
)
def test_get_engine_checks_the_class_against_its_manifest(discovery_of, engine_id, reason):
    discovery = discovery_of("classes")
    with pytest.raises(EngineUnavailable) as caught:
        discovery.get_engine(engine_id)
    assert reason in str(caught.value)
    assert discovery.get_engine("small").__name__ == "Shared"  # the others still import


def test_a_class_that_declares_nothing_carries_its_manifests_devices_dtypes_and_extras(
    discovery_of,
):
    discovery = discovery_of("classes")
    cls = discovery.get_engine("declares-nothing")
    assert (cls.DEVICES, cls.DTYPES, dict(cls.EXTRAS)) == (
        ("cpu", "cuda"),
        ("bfloat16", "float32"),
        {"mizuoto_absent_extra": "mizuoto-absent-extra>=1.0"},
    )
    instance = cls()
    assert instance.DTYPES == ("bfloat16", "float32") and cls.__name__ == "DeclaresNothing"
    assert discovery.get_engine("declares-nothing") is cls
    original = importlib.import_module("mizuoto_fixture_classes.classes").DeclaresNothing
    assert isinstance(instance, original)
    with pytest.raises(AttributeError, match=r"DeclaresNothing\.DEVICES is the manifest's devices"):
        original.DEVICES  # noqa: B018 - the class itself is left as its author wrote it


def test_one_class_serving_two_manifests_reads_each_manifest(discovery_of):
    discovery = discovery_of("classes")
    small, big = discovery.get_engine("small"), discovery.get_engine("big")
    assert (small.DEVICES, big.DEVICES) == (("cpu",), ("cpu", "cuda"))
    assert small.DTYPES == big.DTYPES == ("float32",)  # set by the class, equal to both
    assert discovery.get_engine("small").DEVICES == ("cpu",)  # the second did not overwrite it


def test_in_process_plugins_register_through_the_same_path():
    from types import SimpleNamespace

    from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

    @hookimpl
    def mizuoto_engines():
        return [
            EngineManifest(
                id="inline",
                implementation="somewhere:Engine",
                models=[ModelEntry("m")],
                capabilities=["synthesize"],
            )
        ]

    discovery = Discovery(
        plugins={"inline-dist": SimpleNamespace(mizuoto_engines=mizuoto_engines)},
        entry_points=False,
    )
    (record,) = discovery.records()
    assert (record.id, record.distribution, record.status) == ("inline", "inline-dist", "ok")


@pytest.fixture
def faults(monkeypatch):
    """Discovery of the fixture distribution ``mizuoto-fixture-faults`` alone."""
    monkeypatch.syspath_prepend(str(FIXTURE_SITE))
    return Discovery(path=[str(FIXTURE_SITE)], selection={"mizuoto-fixture-faults"})


def test_a_hook_that_exits_or_raises_a_base_exception_is_failed_and_the_others_load(faults):
    records = by_id(faults)
    assert records["hook-exits"].status == "failed"
    assert "mizuoto_engines raised SystemExit: 4" in records["hook-exits"].error
    assert records["hook-halts"].status == "failed"
    assert "mizuoto_engines raised Halt: the hook stopped on purpose" in records["hook-halts"].error
    assert records["waits"].status == "ok"  # declared by another plugin of the same distribution


class Halt(BaseException):
    pass


def manifest(engine_id: str) -> EngineManifest:
    return EngineManifest(
        id=engine_id, implementation="m:C", models=[ModelEntry("a")], capabilities=["synthesize"]
    )


def in_process(**plugins: object) -> Discovery:
    good = SimpleNamespace(mizuoto_engines=hookimpl(lambda: [manifest("good")]))
    return Discovery(plugins={"good-dist": good, **plugins}, entry_points=False)


def raising(error: BaseException):
    def hook():
        raise error

    return hookimpl(hook, specname="mizuoto_engines")


@pytest.mark.parametrize(
    ("error", "reason"),
    [
        (SystemExit(), "SystemExit"),
        (SystemExit(0), "SystemExit: 0"),
        (SystemExit("bye"), "SystemExit: bye"),
        (GeneratorExit(), "GeneratorExit"),
        (Halt("stop"), "Halt: stop"),
        (MemoryError(), "MemoryError"),
    ],
)
def test_whatever_a_hook_raises_becomes_a_failed_record(error, reason):
    records = by_id(in_process(broken=SimpleNamespace(mizuoto_engines=raising(error))))
    assert records["good"].status == "ok"
    assert records["broken"].status == "failed"
    assert f"mizuoto_engines raised {reason}" in records["broken"].error


def test_ctrl_c_in_a_hook_still_stops_discovery():
    discovery = in_process(broken=SimpleNamespace(mizuoto_engines=raising(KeyboardInterrupt())))
    with pytest.raises(KeyboardInterrupt):
        discovery.records()


class ExitsWhenListed:
    """A plugin object whose attribute listing calls sys.exit: every pluggy version's
    registration lists a plugin's attributes with dir()."""

    def __dir__(self):
        raise SystemExit(5)


class ExitsWhenRead:
    """A plugin object whose hook is a property that calls sys.exit. pluggy before 1.7 reads it
    while registering; 1.7 and later skip properties, and the plugin then implements no hook."""

    @property
    def mizuoto_engines(self):
        raise SystemExit(7)


class ExitsWhenShown:
    def __repr__(self) -> str:
        raise SystemExit(6)


def test_a_plugin_that_exits_while_registered_or_shown_is_failed():
    shown = SimpleNamespace(mizuoto_engines=hookimpl(lambda: ExitsWhenShown()))
    records = by_id(in_process(listed=ExitsWhenListed(), read=ExitsWhenRead(), shown=shown))
    assert records["good"].status == "ok"
    assert records["listed"].status == "failed"
    assert "registration failed: SystemExit: 5" in records["listed"].error
    assert records["read"].status == "failed"  # whether or not this pluggy reads the property
    assert records["shown"].status == "failed"
    assert "expected a list of EngineManifest" in records["shown"].error


@pytest.mark.parametrize(
    ("engine_id", "reason"),
    [
        ("exits-on-import", "SystemExit: 3"),
        ("unknown-dtype", "unknown dtype 'float8'"),
        ("number-dtypes", "NumberDtypesEngine.DTYPES is not valid"),
        ("misspelt", "has no attribute 'WaitingEngin'; did you mean 'WaitingEngine'?"),
    ],
)
def test_an_implementation_that_exits_or_declares_what_the_sdk_cannot_read_is_unavailable(
    faults, engine_id, reason
):
    with pytest.raises(EngineUnavailable) as caught:
        faults.get_engine(engine_id)
    assert caught.value.code == "engine_unavailable"
    assert reason in str(caught.value)
    assert faults.get_engine("waits").__name__ == "WaitingEngine"  # the others still import
