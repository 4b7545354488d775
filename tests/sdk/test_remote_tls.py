"""Protocol 2 over TLS: a `mizuoto agent` process with a certificate, a host that verifies it.

The certificate is self-signed for 127.0.0.1, made here with the `openssl` command; the host
trusts it through `remote.hosts.<name>.tls_ca`, and refuses an agent it cannot verify. A host and
an agent that disagree on TLS are told which setting to change.
"""

from __future__ import annotations

import shutil
import subprocess
import sys

import numpy as np
import pytest

from mizuoto_sdk.errors import EngineUnavailable, WorkerFailed
from mizuoto_sdk.host import EngineRequest, RuntimeService

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def start_agent(*options):
    """A `mizuoto agent` process on a free port of 127.0.0.1 and the address it printed."""
    command = [sys.executable, "-m", "mizuoto_sdk.cli", "agent", "--listen", "127.0.0.1:0"]
    agent = subprocess.Popen([*command, *options], stdout=subprocess.PIPE, text=True)
    assert agent.stdout is not None
    line = agent.stdout.readline()
    assert line.startswith("mizuoto agent listening on "), line
    return agent, line.strip().rsplit("://", 1)[1]


def stop_agent(agent):
    agent.terminate()
    agent.wait(30)
    agent.stdout.close()


@pytest.fixture(scope="module")
def tls_agent(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tls")
    cert, key, token = folder / "agent.pem", folder / "agent.key", folder / "token"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    token.write_text("a secret long enough for a test\n")
    agent, address = start_agent(
        "--token-file", str(token), "--tls-cert", str(cert), "--tls-key", str(key)
    )
    yield {"address": address, "token": str(token), "cert": str(cert)}
    stop_agent(agent)


@pytest.fixture
def plain_agent(tmp_path):
    token = tmp_path / "token"
    token.write_text("a secret long enough for a test\n")
    agent, address = start_agent("--token-file", str(token))
    yield {"address": address, "token": str(token)}
    stop_agent(agent)


def remote(agent, **extra):
    return {
        "engines.sine.device": "box/cpu",
        "remote.hosts.box.address": agent["address"],
        "remote.hosts.box.token_file": agent["token"],
        "remote.hosts.box.tls": True,
        **extra,
    }


def test_audio_over_tls_equals_local_audio(tls_agent):
    params = {"seed": 7}
    with RuntimeService() as here:
        local = [c.samples for c in here.load("sine").synthesize("hello", EngineRequest(params))]
    with RuntimeService(remote(tls_agent, **{"remote.hosts.box.tls_ca": tls_agent["cert"]})) as s:
        model = s.load("sine")
        far = [c.samples for c in model.synthesize("hello", EngineRequest(params))]
        again = [c.samples for c in model.synthesize("hello", EngineRequest(params))]
    assert len(far) == len(local) == len(again)
    for a, b, c in zip(local, far, again, strict=True):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_array_equal(a, c)


def test_a_host_refuses_an_agent_whose_certificate_it_cannot_verify(tls_agent):
    service = RuntimeService(remote(tls_agent))  # no tls_ca: the system's, which lacks it
    with service, pytest.raises(WorkerFailed) as caught:
        list(service.load("sine").synthesize("hello"))
    assert "certificate" in str(caught.value).lower()


def test_a_read_on_a_tls_connection_this_side_closed_ends_as_closed(tls_agent):
    """The session's reader may reach its wait just after the session closed the socket: that
    read ends as a closed connection, not as a ValueError about descriptor -1 in its thread."""
    import socket
    import ssl

    from mizuoto_sdk.remote.wire import ConnectionClosed, FrameSocket

    host, port = tls_agent["address"].rsplit(":", 1)
    context = ssl.create_default_context(cafile=tls_agent["cert"])
    raw = socket.create_connection((host, int(port)), timeout=30)
    wire = FrameSocket(context.wrap_socket(raw, server_hostname=host))
    wire.close()
    with pytest.raises(ConnectionClosed):
        wire.receive()


def test_a_host_without_tls_at_a_tls_agent_is_told_to_set_tls(tls_agent):
    # What a user saw: "Connection reset by peer" during the hello.
    service = RuntimeService(remote(tls_agent, **{"remote.hosts.box.tls": False}))
    with service, pytest.raises(EngineUnavailable) as caught:
        list(service.load("sine").synthesize("hello"))
    assert caught.value.detail["field"] == "remote.hosts.box.tls"
    assert "expects TLS" in caught.value.message
    assert "set remote.hosts.box.tls = true" in caught.value.message


def test_a_tls_host_at_a_plain_agent_is_told_it_may_serve_plain_tcp(plain_agent):
    # What a user saw: "cannot connect to ...: [SSL: WRONG_VERSION_NUMBER] wrong version number".
    service = RuntimeService(remote(plain_agent))
    with service, pytest.raises(EngineUnavailable) as caught:
        list(service.load("sine").synthesize("hello"))
    assert caught.value.detail["field"] == "remote.hosts.box.tls"
    assert "set remote.hosts.box.tls = false" in caught.value.message
