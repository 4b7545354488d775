"""Discovery against real fixture distributions: each plugin isolated, every failure explained."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import manifest_arguments, plugin_source

from mizuoto_sdk import (
    Engine,
    EngineManifest,
    EngineNotFound,
    EngineUnavailable,
    ModelEntry,
    hookimpl,
)
from mizuoto_sdk.host import Discovery

# A real distribution of plugins and engines that misbehave on purpose (see its package docstring).
FIXTURE_SITE = Path(__file__).parent / "fixture_site"

ENGINE = """
    from mizuoto_sdk import Engine

    class Good(Engine):
        DEVICES = ("cpu",)
"""


def good_plugin(engine_id: str, engine_module: str, extra: str = "devices=['cpu']") -> str:
    return plugin_source(manifest_arguments(engine_id, f"{engine_module}:Good", extra))


@pytest.fixture
def discovery_of(site):
    return lambda **options: Discovery(path=[str(site)], **{"selection": None, **options})


def by_id(discovery: Discovery) -> dict:
    return {r.id: r for r in discovery.records()}


def test_a_good_plugin_lists_its_manifest_without_importing_the_engine(
    make_dist, unique, discovery_of
):
    engine, plugin = unique("eng"), unique("plug")
    make_dist(
        "dist-good",
        {engine: ENGINE, plugin: good_plugin("good", engine)},
        {"good": plugin},
        version="2.3",
    )
    record = by_id(discovery_of())["good"]
    assert record.status == "ok" and record.error is None
    assert (record.distribution, record.version) == ("dist-good", "2.3")
    assert record.manifest.devices == ("cpu",)
    assert record.manifest.models[0].id == "a"
    assert engine not in sys.modules  # listing reads manifests only


@pytest.mark.parametrize(
    ("source", "reason"),
    [
        ("raise RuntimeError('no such backend')", "RuntimeError: no such backend"),
        ("import sys\nsys.exit(3)", "SystemExit"),
        ("import mizuoto_not_installed_anywhere", "ModuleNotFoundError"),
    ],
)
def test_a_plugin_that_fails_to_import_is_failed_and_the_others_still_load(
    make_dist, unique, discovery_of, source, reason
):
    engine, good, broken = unique("eng"), unique("good"), unique("broken")
    make_dist("dist-good", {engine: ENGINE, good: good_plugin("good", engine)}, {"good": good})
    make_dist("dist-broken", {broken: source}, {"broken": broken})
    records = by_id(discovery_of())
    assert records["good"].status == "ok"
    assert records["broken"].status == "failed"
    assert records["broken"].distribution == "dist-broken"
    assert reason in records["broken"].error
    assert "import failed" in records["broken"].error


def test_a_misspelled_hook_is_caught_by_check_pending_with_a_suggestion(
    make_dist, unique, discovery_of
):
    plugin = unique("typo")
    source = """
        from mizuoto_sdk import hookimpl

        @hookimpl
        def mizuoto_engine():
            return []
    """
    make_dist("dist-typo", {plugin: source}, {"typo": plugin})
    record = by_id(discovery_of())["typo"]
    assert record.status == "failed"
    assert "mizuoto_engine" in record.error
    assert "did you mean 'mizuoto_engines'" in record.error


def test_an_unmarked_hook_is_reported_as_implementing_nothing(make_dist, unique, discovery_of):
    plugin = unique("unmarked")
    make_dist(
        "dist-unmarked", {plugin: "def mizuoto_engines():\n    return []\n"}, {"unmarked": plugin}
    )
    record = by_id(discovery_of())["unmarked"]
    assert record.status == "failed"
    assert "implements no Mizuoto hook" in record.error
    assert "@mizuoto_sdk.hookimpl" in record.error


def test_a_hook_with_an_unknown_argument_fails_registration(make_dist, unique, discovery_of):
    plugin = unique("args")
    source = """
        from mizuoto_sdk import hookimpl

        @hookimpl
        def mizuoto_engines(registry):
            return []
    """
    make_dist("dist-args", {plugin: source}, {"args": plugin})
    record = by_id(discovery_of())["args"]
    assert record.status == "failed"
    assert "registry" in record.error


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        ("return {'id': 'x'}", "expected a list of EngineManifest"),
        ("return ['x']", "expected a list of EngineManifest"),
        ("raise KeyError('boom')", "mizuoto_engines raised KeyError"),
        (
            "return [EngineManifest(id='Bad Id', implementation='m:C', "
            "models=[ModelEntry('a')], capabilities=['synthesize'])]",
            "EngineManifest.id",
        ),
        (
            "return [EngineManifest(id='x', implementation='m:C', models=[ModelEntry('a')], "
            "capabilities=['synthesize'], devices=['tpu'])]",
            "devices: unknown ['tpu']",
        ),
    ],
)
def test_a_hook_returning_garbage_is_failed_with_the_reason(
    make_dist, unique, discovery_of, body, reason
):
    plugin = unique("garbage")
    source = f"""
        from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

        @hookimpl
        def mizuoto_engines():
            {body}
    """
    make_dist("dist-garbage", {plugin: source}, {"garbage": plugin})
    record = by_id(discovery_of())["garbage"]
    assert record.status == "failed"
    assert reason in record.error


def test_a_newer_major_api_version_is_incompatible_and_names_what_it_needs(
    make_dist, unique, discovery_of
):
    engine, plugin = unique("eng"), unique("future")
    make_dist(
        "dist-future",
        {engine: ENGINE, plugin: good_plugin("future", engine, "api_version='2.0'")},
        {"future": plugin},
    )
    record = by_id(discovery_of())["future"]
    assert record.status == "incompatible"
    assert "2.0" in record.error and "API 1.x" in record.error
    with pytest.raises(EngineUnavailable, match="incompatible"):
        discovery_of().get_engine("future")


def test_a_newer_minor_api_version_still_loads(make_dist, unique, discovery_of):
    engine, plugin = unique("eng"), unique("minor")
    make_dist(
        "dist-minor",
        {engine: ENGINE, plugin: good_plugin("minor", engine, "api_version='1.9'")},
        {"minor": plugin},
    )
    assert by_id(discovery_of())["minor"].status == "ok"


def test_two_distributions_with_one_engine_id_conflict_and_name_each_other(
    make_dist, unique, discovery_of
):
    engine, first, second = unique("eng"), unique("first"), unique("second")
    make_dist("dist-first", {engine: ENGINE, first: good_plugin("twin", engine)}, {"twin": first})
    make_dist("dist-second", {second: good_plugin("twin", engine)}, {"twin": second})
    records = [r for r in discovery_of().records() if r.id == "twin"]
    assert sorted(r.distribution for r in records) == ["dist-first", "dist-second"]
    assert all(r.status == "conflict" for r in records)
    first_record = next(r for r in records if r.distribution == "dist-first")
    assert "dist-second" in first_record.error
    with pytest.raises(EngineUnavailable, match="conflict"):
        discovery_of().get_engine("twin")


def test_mizuoto_plugins_selects_distributions(make_dist, unique, site, monkeypatch):
    engine, one, two = unique("eng"), unique("one"), unique("two")
    make_dist("dist-one", {engine: ENGINE, one: good_plugin("one", engine)}, {"one": one})
    make_dist("Dist_Two", {two: good_plugin("two", engine)}, {"two": two})

    def listed() -> set[str]:
        return {r.id for r in Discovery(path=[str(site)]).records()}

    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    assert listed() == {"one", "two"}
    monkeypatch.setenv("MIZUOTO_PLUGINS", "")
    assert listed() == set()
    monkeypatch.setenv("MIZUOTO_PLUGINS", "dist-one")
    assert listed() == {"one"}
    monkeypatch.setenv("MIZUOTO_PLUGINS", " dist-two , nothing-else")
    assert listed() == {"two"}


def test_get_engine_imports_the_class_and_an_unknown_id_lists_the_known_ones(
    make_dist, unique, discovery_of
):
    engine, plugin = unique("eng"), unique("plug")
    make_dist("dist-good", {engine: ENGINE, plugin: good_plugin("good", engine)}, {"good": plugin})
    cls = discovery_of().get_engine("good")
    assert issubclass(cls, Engine) and cls.__name__ == "Good"
    with pytest.raises(EngineNotFound) as caught:
        discovery_of().get_engine("nope")
    assert caught.value.code == "engine_not_found"
    assert "known engines: good" in str(caught.value)
    assert caught.value.detail["known"] == ["good"]


def test_get_engine_never_returns_a_plugin_that_failed_to_import(make_dist, unique, discovery_of):
    broken = unique("broken")
    make_dist("dist-broken", {broken: "raise ImportError('gone')"}, {"broken": broken})
    with pytest.raises(EngineNotFound):  # a failed plugin never named an engine
        discovery_of().get_engine("broken")


@pytest.mark.parametrize(
    ("engine_source", "reason"),
    [
        (
            "from mizuoto_sdk import Engine\nclass Good(Engine):\n    DEVICES = ('cuda',)\n",
            "DEVICES",
        ),
        (
            "from mizuoto_sdk import Engine\nclass Good(Engine):\n    DEVICES = ('cpu',)\n"
            "    DTYPES = ('bf16', 'fp32')\n",
            "DTYPES",
        ),
        (
            "from mizuoto_sdk import Engine\nclass Good(Engine):\n    DEVICES = ('cpu',)\n"
            "    EXTRAS = {'librosa': 'librosa>=0.10'}\n",
            "EXTRAS",
        ),
        ("class Good:\n    DEVICES = ('cpu',)\n", "not a subclass of mizuoto_sdk.Engine"),
        (
            "from mizuoto_sdk import Engine\nclass Good(Engine):\n    DEVICES = ('cpu',)\n"
            "    def __init_subclass__(cls):\n        raise TypeError('final')\n",
            "(TypeError: final); set DEVICES, DTYPES and EXTRAS on the class",
        ),
        ("raise OSError('missing weights')", "OSError: missing weights"),
        ("X = 1\n", "AttributeError"),
    ],
)
def test_get_engine_checks_the_class_against_its_manifest(
    make_dist, unique, discovery_of, engine_source, reason
):
    engine, plugin = unique("eng"), unique("plug")
    make_dist("dist-x", {engine: engine_source, plugin: good_plugin("x", engine)}, {"x": plugin})
    with pytest.raises(EngineUnavailable) as caught:
        discovery_of().get_engine("x")
    assert reason in str(caught.value)


def test_a_class_that_declares_nothing_carries_its_manifests_devices_dtypes_and_extras(
    make_dist, unique, discovery_of
):
    engine, plugin = unique("eng"), unique("plug")
    extra = "devices=['cpu', 'cuda'], dtypes=['bf16', 'fp32'], extras={'librosa': 'librosa>=0.10'}"
    source = "from mizuoto_sdk import Engine\nclass Good(Engine):\n    pass\n"
    make_dist("dist-x", {engine: source, plugin: good_plugin("x", engine, extra)}, {"x": plugin})
    discovery = discovery_of()
    cls = discovery.get_engine("x")
    assert (cls.DEVICES, cls.DTYPES, dict(cls.EXTRAS)) == (
        ("cpu", "cuda"),
        ("bfloat16", "float32"),
        {"librosa": "librosa>=0.10"},
    )
    instance = cls()
    assert instance.DTYPES == ("bfloat16", "float32") and cls.__name__ == "Good"
    assert discovery.get_engine("x") is cls
    original = sys.modules[engine].Good
    assert isinstance(instance, original)
    with pytest.raises(AttributeError, match=r"Good\.DEVICES is the manifest's devices"):
        original.DEVICES  # noqa: B018 - the class itself is left as its author wrote it


def test_one_class_serving_two_manifests_reads_each_manifest(site, unique):
    engine = unique("shared")
    (site / f"{engine}.py").write_text(
        "from mizuoto_sdk import Engine\nclass Shared(Engine):\n    DTYPES = ('float32',)\n"
    )

    @hookimpl
    def mizuoto_engines():
        return [
            EngineManifest(
                id=engine_id,
                implementation=f"{engine}:Shared",
                models=[ModelEntry("a")],
                capabilities=["synthesize"],
                devices=devices,
            )
            for engine_id, devices in (("small", ["cpu"]), ("big", ["cpu", "cuda"]))
        ]

    discovery = Discovery(
        plugins={"dist-shared": SimpleNamespace(mizuoto_engines=mizuoto_engines)},
        entry_points=False,
    )
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


class ExitsWhenRead:
    """A plugin object whose attribute lookup (which registration does) calls sys.exit."""

    @property
    def mizuoto_engines(self):
        raise SystemExit(5)


class ExitsWhenShown:
    def __repr__(self) -> str:
        raise SystemExit(6)


def test_a_plugin_that_exits_while_registered_or_shown_is_failed():
    shown = SimpleNamespace(mizuoto_engines=hookimpl(lambda: ExitsWhenShown()))
    records = by_id(in_process(read=ExitsWhenRead(), shown=shown))
    assert records["good"].status == "ok"
    assert records["read"].status == "failed"
    assert "SystemExit: 5" in records["read"].error
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
