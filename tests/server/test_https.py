"""``mizuoto serve --tls-cert C --tls-key K``: HTTPS, named in server.json, trusted by the local
commands; and the warning of a server beyond loopback without it.

The certificate is self-signed for 127.0.0.1, made here with the ``openssl`` command.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from server_support import server_env, start_server, stop_server

from mizuoto_sdk.server.client import ServerUnreachable, find_server
from mizuoto_sdk.server.record import read_record

pytest.importorskip("uvicorn", reason="the server's tests need uvicorn (requirements-dev.txt)")
if shutil.which("openssl") is None:
    pytest.skip("making a test certificate needs the openssl command", allow_module_level=True)

WARNING = "without TLS: the token, and every request, travel in clear"


def certificate(folder: Path, name: str = "server") -> tuple[Path, Path]:
    cert, key = folder / f"{name}.pem", folder / f"{name}.key"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


Served = tuple[dict[str, object], dict[str, str], Path]
"""A server's record, the environment of a command that finds it, and its log."""


def served(folder: Path, *arguments: str) -> Iterator[Served]:
    home = folder / "home"
    settings = folder / "settings.toml"
    settings.write_text("")
    env = server_env(home, settings)
    process, record, log = start_server(home, env, *arguments)
    try:
        yield record, env, log
    finally:
        stop_server(process)


@pytest.fixture(scope="module")
def https_server(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Served]:
    folder = tmp_path_factory.mktemp("https")
    cert, key = certificate(folder)
    yield from served(folder, "--tls-cert", str(cert), "--tls-key", str(key))


def test_server_json_says_https_and_names_the_certificate(https_server: Served) -> None:
    record, _env, log = https_server
    assert str(record["url"]).startswith("https://127.0.0.1:")
    assert Path(str(record["tls_cert"])).is_absolute()
    assert WARNING not in log.read_text()  # loopback: nothing travels beyond this machine


def test_a_client_trusting_the_certificate_synthesizes_and_plain_http_gets_nothing(
    https_server: Served,
) -> None:
    record, _env, _log = https_server
    trusting = ssl.create_default_context(cafile=str(record["tls_cert"]))
    with httpx.Client(base_url=str(record["url"]), verify=trusting, timeout=60) as client:
        answer = client.post("/api/v1/synthesize", json={"engine": "sine", "text": "a b"})
        assert answer.status_code == 200 and answer.content[:4] == b"RIFF"
    plain = str(record["url"]).replace("https://", "http://")
    with pytest.raises(httpx.HTTPError):  # the TLS server drops a request in clear
        httpx.get(f"{plain}/api/v1/health", timeout=10)
    with pytest.raises(httpx.ConnectError):  # the system's trust store does not know it
        httpx.get(f"{record['url']}/api/v1/health", timeout=10)


def test_the_local_commands_ask_it_over_https(https_server: Served) -> None:
    record, env, _log = https_server
    client, where = find_server(Path(env["MIZUOTO_HOME"]) / "server.json")
    assert client is not None, where
    assert where == f"server {record['url']} (pid {record['pid']})"
    assert client.get("/api/v1/health")["pid"] == record["pid"]  # type: ignore[index]
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "runtime"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[0] == where


def test_a_certificate_that_is_not_the_servers_is_not_trusted(
    https_server: Served, tmp_path: Path
) -> None:
    """The client pins the certificate server.json names: another one fails the handshake."""
    _record, env, _log = https_server
    other, _ = certificate(tmp_path, "other")
    data = json.loads((Path(env["MIZUOTO_HOME"]) / "server.json").read_text())
    forged = tmp_path / "server.json"
    forged.write_text(json.dumps({**data, "tls_cert": str(other)}))
    found = read_record(forged)
    assert found is not None and found.tls_cert == str(other)
    client, where = find_server(forged)
    assert client is None and "does not answer" in where, where


def test_tls_cert_without_its_key_is_a_usage_error(tmp_path: Path) -> None:
    cert, _ = certificate(tmp_path)
    env = server_env(tmp_path / "home", tmp_path / "settings.toml")
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "serve", "--tls-cert", str(cert)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "--tls-cert and --tls-key go together" in done.stderr


def test_beyond_loopback_without_tls_it_warns_once(tmp_path: Path) -> None:
    for record, _env, log in served(tmp_path, "--host", "0.0.0.0"):
        assert record["token"] and str(record["url"]).startswith("http://127.0.0.1:")
        assert log.read_text().count(WARNING) == 1


def test_unreachable_names_a_certificate_it_cannot_read(
    https_server: Served, tmp_path: Path
) -> None:
    _record, env, _log = https_server
    data = json.loads((Path(env["MIZUOTO_HOME"]) / "server.json").read_text())
    forged = tmp_path / "server.json"
    forged.write_text(json.dumps({**data, "tls_cert": str(tmp_path / "missing.pem")}))
    found = read_record(forged)
    assert found is not None
    from mizuoto_sdk.server.client import ServerClient

    with pytest.raises(ServerUnreachable, match="cannot be read"):
        ServerClient(found).get("/api/v1/health")
