"""Fixtures that install real fixture distributions (dist-info + entry points) on sys.path."""

from __future__ import annotations

import importlib
import sys
import textwrap
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest

from mizuoto_sdk.host import Discovery

MakeDist = Callable[..., Path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip cleanly on machines without a CUDA device."""
    marked = [item for item in items if "cuda" in item.keywords]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh site directory on sys.path; modules imported from it are forgotten afterwards."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        if str(getattr(module, "__file__", "") or "").startswith(str(directory)):
            del sys.modules[name]


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Module names unique to one test, so sys.modules never serves another test's module."""
    token = uuid.uuid4().hex[:8]
    return lambda name: f"{name}_{token}"


@pytest.fixture
def make_dist(site: Path) -> MakeDist:
    """Write a distribution: its modules and a dist-info with ``mizuoto.engines`` entry points."""

    def make(
        name: str,
        modules: Mapping[str, str],
        entry_points: Mapping[str, str],
        version: str = "1.0",
    ) -> Path:
        for module, source in modules.items():
            path = site / (module.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[mizuoto.engines]\n{lines}")
        return site

    return make


def plugin_source(arguments: str) -> str:
    """A plugin module whose hook returns ``[EngineManifest(<arguments>)]``."""
    return f"""
        from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

        @hookimpl
        def mizuoto_engines():
            return [EngineManifest({arguments})]
    """


def manifest_arguments(engine_id: str, implementation: str, extra: str = "") -> str:
    """Keyword arguments for a typical manifest: models a, b, c; three capabilities."""
    return (
        f"id={engine_id!r}, implementation={implementation!r}, "
        "models=[ModelEntry('a'), ModelEntry('b'), ModelEntry('c')], "
        "capabilities=['synthesize', 'prepare_voice', 'call']" + (f", {extra}" if extra else "")
    )


# A real distribution holding a configurable engine for the host tests (see its package docstring).
HOST_FIXTURE_SITE = Path(__file__).parent / "fixture_site"


@pytest.fixture
def host_engine(monkeypatch: pytest.MonkeyPatch) -> SimpleNamespace:
    """Engine ``hosted`` of distribution ``mizuoto-fixture-host``, found through its entry point.

    The engine module is shared between tests, so its ``EVENTS`` list is emptied here; tests that
    patch its classes do so through ``monkeypatch``, which undoes them afterwards.
    """
    monkeypatch.syspath_prepend(str(HOST_FIXTURE_SITE))
    module = importlib.import_module("mizuoto_fixture_host.engine")
    module.EVENTS.clear()
    discovery = Discovery(path=[str(HOST_FIXTURE_SITE)], selection=None)
    return SimpleNamespace(
        discovery=discovery, events=module.EVENTS, engine_id="hosted", module=module
    )
