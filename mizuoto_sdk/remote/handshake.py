"""How a host opens a session with an agent: connect (TLS when ``tls``), ``hello`` with the
token and protocol, ``open`` the engine on the agent's device, ``load`` the model.

All of it must be done within one deadline: ``remote.load_timeout``, or the first request's own
timeout when that is shorter. Heartbeats keep coming while an agent loads, so silence alone never
ends a load that hangs; the deadline does, with ``operation_timeout``, and the connection is
closed, which tells the agent to drop the model once its load returns.

A host and an agent that disagree on TLS are told which setting to change: a TLS agent refuses a
plain hello in plain words (reason ``tls``), and a reset or a TLS record where a frame was due
says the same; a TLS handshake that a plain agent cannot answer says the reverse.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Mapping
from typing import Any

from mizuoto_sdk.errors import EngineUnavailable, OperationTimeoutError, WorkerFailed
from mizuoto_sdk.frames import Frame, FrameError, error_from_frame
from mizuoto_sdk.remote.hosts import RemoteHost, sdk_version
from mizuoto_sdk.remote.wire import PROTOCOL, ConnectionClosed, FrameSocket, PeerSpeaksTLS

__all__ = ["Deadline", "open_session", "session_detail", "session_failed"]

_REFUSAL_FIXES = {
    "token": "; check that remote.hosts.{name}.token_file holds the agent's --token-file secret",
    "timeout": "; the hello came too late: check the address and the network",
}


class Deadline:
    """When a session's start must be done by, and the setting that says so (None: the
    request's own timeout)."""

    def __init__(self, seconds: float, setting: str | None) -> None:
        self.seconds, self.setting = seconds, setting
        self.at = time.monotonic() + seconds

    @classmethod
    def start(cls, host: RemoteHost, timeout: float | None) -> Deadline:
        """``remote.load_timeout``, or ``timeout`` (a request's) when it is shorter."""
        if timeout is not None and timeout < host.load_timeout:
            return cls(timeout, None)
        return cls(host.load_timeout, "remote.load_timeout")

    def left(self) -> float:
        return self.at - time.monotonic()


def open_session(
    host: RemoteHost,
    engine_id: str,
    device: str,
    load: Mapping[str, object],
    deadline: Deadline,
) -> tuple[FrameSocket, dict[str, Any], dict[str, Any]]:
    """A connection with ``engine_id`` open on the agent's ``device`` and its model loaded, what
    the agent said in ``ready``, and what it said of the model. The agent's own refusal or error
    comes out as it sent it (plus ``host``), a connection that fails as ``worker_failed``
    (``during``: the step), a start past ``deadline`` as ``operation_timeout``."""
    token = host.token()
    try:
        sock = host.connect()
    except (OSError, ValueError) as error:
        handshake = isinstance(error, ssl.SSLError | ConnectionResetError)
        if host.tls and handshake and not isinstance(error, ssl.SSLCertVerificationError):
            raise _tls_mismatch(host, engine_id, agent_tls=False, seen=str(error)) from None
        raise session_failed(
            host, engine_id, f"cannot connect to {host.address}: {error}", "connect"
        ) from None
    wire = FrameSocket(sock)
    try:
        wire.send("hello", {"protocol": PROTOCOL, "token": token, "version": sdk_version()})
        ready = _expect(host, engine_id, wire, "ready", "hello", deadline)
        theirs = ready.header.get("protocol")
        if theirs != PROTOCOL:
            raise EngineUnavailable(
                f"the agent {host.name} ({host.address}) speaks protocol {theirs!r} "
                f"(Mizuoto {ready.header.get('version')}), this host protocol {PROTOCOL} "
                f"(Mizuoto {sdk_version()}): install the same Mizuoto version on both machines",
                session_detail(
                    host, engine_id, reason="protocol", protocol=theirs, expected=PROTOCOL
                ),
            )
        wire.send("open", {"engine": engine_id, "device": device})
        _expect(host, engine_id, wire, "result", "open", deadline)
        wire.send("load", load)
        loaded = _expect(host, engine_id, wire, "result", "load", deadline)
        sock.settimeout(None)
    except BaseException:
        wire.close()
        raise
    return wire, dict(ready.header), dict(loaded.header)


def session_failed(host: RemoteHost, engine_id: str, reason: str, during: str) -> WorkerFailed:
    """The one error of a session that failed (``during``: what was going on)."""
    return WorkerFailed(
        f"{engine_id}: the agent {host.name} ({host.address}) failed during {during}: {reason}",
        session_detail(host, engine_id, during=during, reason=reason),
    )


def session_detail(host: RemoteHost, engine_id: str, **fields: object) -> dict[str, object]:
    return {"engine": engine_id, "host": host.name, "address": host.address, **fields}


def _expect(
    host: RemoteHost, engine_id: str, wire: FrameSocket, kind: str, during: str, deadline: Deadline
) -> Frame:
    """The agent's answer to ``during`` (heartbeats skipped), by ``deadline``; its refusal or
    error raised."""
    while True:
        left = deadline.left()
        if left <= 0:
            raise _late(host, engine_id, during, deadline)
        wire.socket.settimeout(min(host.heartbeat_timeout, left))
        try:
            frame = wire.receive()
        except TimeoutError:
            if deadline.left() <= 0:
                raise _late(host, engine_id, during, deadline) from None
            silent = f"the agent sent nothing for {host.heartbeat_timeout:g} s"
            silent += " (remote.heartbeat_timeout)"
            raise session_failed(host, engine_id, silent, during) from None
        except ConnectionClosed:
            raise session_failed(
                host, engine_id, "the agent closed the connection", during
            ) from None
        except PeerSpeaksTLS:
            raise _tls_mismatch(host, engine_id, agent_tls=True) from None
        except (OSError, FrameError) as error:
            if isinstance(error, ConnectionResetError) and during == "hello" and not host.tls:
                raise _tls_mismatch(host, engine_id, agent_tls=True, seen=str(error)) from None
            raise session_failed(
                host, engine_id, f"the connection failed: {error}", during
            ) from None
        if frame.kind == "heartbeat":
            continue
        if frame.kind in ("refused", "error"):
            raise _answer(host, engine_id, frame, during)
        if frame.kind != kind:
            raise session_failed(
                host, engine_id, f"the agent sent {frame.kind} where {kind} was due", during
            )
        return frame


def _answer(host: RemoteHost, engine_id: str, frame: Frame, during: str) -> Exception:
    """The agent's refusal or error, saying whose, and what to check."""
    try:
        answer = error_from_frame(frame)
    except FrameError as malformed:
        return session_failed(host, engine_id, str(malformed), during)
    answer.detail.setdefault("host", host.name)
    if answer.detail.get("reason") == "tls":
        return _tls_mismatch(host, engine_id, agent_tls=True)
    if frame.kind == "refused":
        fix = _REFUSAL_FIXES.get(str(answer.detail.get("reason")), "")
        answer = type(answer)(
            f"agent {host.name!r} at {host.address} refused the connection: "
            f"{answer.message}{fix.format(name=host.name)}",
            answer.detail,
        )
    return answer


def _late(
    host: RemoteHost, engine_id: str, during: str, deadline: Deadline
) -> OperationTimeoutError:
    limit = f"{deadline.setting} = {deadline.seconds:g} s" if deadline.setting else None
    message = (
        f"{engine_id}: the agent {host.name} ({host.address}) had not finished {during} within "
        f"{limit or f'the request timeout of {deadline.seconds:g} s'}; the session was closed"
    )
    detail = session_detail(
        host, engine_id, during=during, reason="timeout", timeout=deadline.seconds
    )
    if deadline.setting:
        detail["field"] = deadline.setting
    return OperationTimeoutError(message, detail)


def _tls_mismatch(
    host: RemoteHost, engine_id: str, *, agent_tls: bool, seen: str = ""
) -> EngineUnavailable:
    """The host and the agent disagree on TLS (``agent_tls``: the agent serves it)."""
    field = f"remote.hosts.{host.name}.tls"
    where = f"the agent {host.name!r} at {host.address}"
    if agent_tls:
        said = f" (the connection: {seen})" if seen else ""
        message = (
            f"{where} expects TLS{said}, and this host connected without it: set {field} = true "
            f"(and remote.hosts.{host.name}.tls_ca to the agent's certificate when it is "
            "self-signed)"
        )
    else:
        message = (
            f"{where} did not complete a TLS handshake ({seen}): if it was started without "
            f"--tls-cert it serves plain TCP; then set {field} = false, or restart it with "
            "--tls-cert and --tls-key"
        )
    detail = session_detail(host, engine_id, field=field, reason="tls", agent_tls=agent_tls)
    return EngineUnavailable(message, detail)
