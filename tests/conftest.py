"""Fixtures that install real fixture distributions (dist-info + entry points) on sys.path."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from mizuoto_sdk.host import Discovery


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


@pytest.fixture(autouse=True)
def own_data_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Every test runs with a data folder of the test session's own (``MIZUOTO_HOME``): a server
    the developer runs is never asked, and nothing lands in the user's data folder."""
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path_factory.getbasetemp() / "mizuoto-home"))


# One site folder per case: real fixture distributions (dist-info + package) that plugin discovery
# meets, good and broken; each package docstring says what its case is.
PLUGIN_SITES = Path(__file__).parent / "sdk" / "plugin_sites"


@pytest.fixture
def plugin_site(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., list[str]]]:
    """``plugin_site("good", "twins")`` puts those case folders (and nothing else) on sys.path.

    Returns the folders, for ``Discovery(path=...)`` or a child's PYTHONPATH. Modules imported
    from them are forgotten afterwards, so each test imports its plugins afresh.
    """
    installed: list[str] = []

    def install(*cases: str) -> list[str]:
        folders = [str(PLUGIN_SITES / case) for case in cases]
        for folder in folders:
            assert Path(folder).is_dir(), f"no fixture site {folder}"
            monkeypatch.syspath_prepend(folder)
        installed.extend(folders)
        return folders

    before = set(sys.modules)
    yield install
    for name in set(sys.modules) - before:
        file = str(getattr(sys.modules.get(name), "__file__", "") or "")
        if any(file.startswith(folder + os.sep) for folder in installed):
            del sys.modules[name]


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


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """One real ``mizuoto serve`` for the server's tests (tests/server): a subprocess on a free
    loopback port with its own data folder, the bundled engines and the ``faulty`` test engine,
    shared by the session (starting a server imports the host and loads engines: seconds on two
    cores). A ``server_support.RunningServer``."""
    for name in ("httpx", "fastapi", "uvicorn"):
        pytest.importorskip(name, reason=f"the server's tests need {name} (requirements-dev.txt)")
    import httpx
    from server_support import RunningServer, server_env, start_server, stop_server

    root = tmp_path_factory.mktemp("server")
    home = root / "home"
    settings = root / "settings.toml"
    settings.write_text("")
    env = server_env(home, settings)
    process, record, log = start_server(home, env)
    client = httpx.Client(base_url=str(record["url"]), timeout=60)
    try:
        yield RunningServer(
            url=str(record["url"]),
            pid=process.pid,
            home=home,
            env=env,
            record=record,
            client=client,
            process=process,
            log=log,
        )
    finally:
        client.close()
        stop_server(process)
