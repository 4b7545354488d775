"""One real ``mizuoto serve`` for the server's tests: a subprocess on a free loopback port with
its own data folder, the bundled engines and the ``faulty`` test engine, shared by the session
(starting a server imports the host and loads engines: seconds on two cores)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("httpx", reason="the server's tests need httpx (requirements-dev.txt)")
pytest.importorskip("fastapi", reason="the server's tests need the server extra (fastapi)")
pytest.importorskip("uvicorn", reason="the server's tests need the server extra (uvicorn)")

import httpx
from server_support import RunningServer, server_env, start_server, stop_server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
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
