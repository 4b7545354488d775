"""Asking a running ``mizuoto serve`` over its HTTP API: what ``mizuoto runtime`` and
``mizuoto doctor`` use when server.json names a live server.

Standard library only. ``http.client`` is imported inside the functions that talk to a server,
since importing it loads ssl: a command that finds no server loads neither.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from mizuoto_sdk.errors import ERROR_CODES, EngineError, error_from_code
from mizuoto_sdk.server.record import live_record, record_path

if TYPE_CHECKING:
    import ssl
    from http.client import HTTPConnection

    from mizuoto_sdk.server.record import ServerRecord

__all__ = ["ServerClient", "ServerError", "ServerUnreachable", "find_server"]

HEALTH = "/api/v1/health"
HEALTH_TIMEOUT = 3.0  # seconds: a server that is up answers its health check at once


class ServerError(Exception):
    """The server answered with an error whose code is not an engine error code (such as
    ``unauthorized`` or ``not_found``), or with something that is not the API's JSON."""

    def __init__(
        self, code: str, status: int, message: str, detail: Mapping[str, object] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.status = status
        self.message = message
        self.detail = dict(detail or {})

    def __str__(self) -> str:
        return f"{self.message} (HTTP {self.status})"


class ServerUnreachable(ConnectionError):
    """The server refused the connection, did not answer in time, or closed it midway."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"no answer from the server at {url}: {reason}")
        self.url = url
        self.reason = reason


class ServerClient:
    """JSON requests to the server that ``record`` describes, with its token when it has one.

    An error answer raises the error its code names: an engine error code (``invalid_request``,
    ``engine_not_found``, ...) as that ``EngineError`` subclass, any other code as ``ServerError``.
    """

    def __init__(self, record: ServerRecord, timeout: float = 10.0) -> None:
        self.record = record
        self.timeout = timeout

    @property
    def url(self) -> str:
        return self.record.url

    def get(self, path: str, *, timeout: float | None = None) -> object:
        """The JSON answer to ``GET path``; ``timeout`` (seconds) overrides the client's."""
        return self._request("GET", path, None, timeout)

    def post(
        self, path: str, body: Mapping[str, object], *, timeout: float | None = None
    ) -> object:
        """The JSON answer to ``POST path`` with ``body`` as JSON; ``timeout`` as for ``get``."""
        return self._request("POST", path, json.dumps(dict(body)).encode(), timeout)

    def _connection(self, timeout: float) -> HTTPConnection:
        """To the record's URL, which ``serve`` writes as an address this machine can reach;
        over HTTPS trusting the certificate the record names, and only it."""
        from http.client import HTTPConnection, HTTPSConnection

        parts = urlsplit(self.record.url)
        if parts.scheme != "https":
            return HTTPConnection(parts.hostname or "", parts.port, timeout=timeout)
        return HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout, context=trusting(self.record)
        )

    def _request(self, method: str, path: str, body: bytes | None, timeout: float | None) -> object:
        import http.client

        timeout = self.timeout if timeout is None else timeout
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        if self.record.token:
            headers["Authorization"] = f"Bearer {self.record.token}"
        connection = self._connection(timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            status, payload = response.status, response.read()
        except TimeoutError as error:
            raise ServerUnreachable(self.url, f"no answer within {timeout:g} s") from error
        except (OSError, http.client.HTTPException) as error:
            raise ServerUnreachable(self.url, str(error) or type(error).__name__) from error
        finally:
            connection.close()
        try:
            document = json.loads(payload) if payload else None
        except ValueError:
            document = None
        if status < 400:
            if document is None and payload:
                raise ServerError(
                    "bad_response", status, f"{method} {path}: the answer is not JSON"
                )
            return document
        raise _error(method, path, status, document)


def trusting(record: ServerRecord) -> ssl.SSLContext:
    """A TLS client context that trusts the certificate ``record`` names, and nothing else.

    The record is the server's own file, readable by its owner only, so the certificate it names
    is the one the server shows: it is pinned (a trust anchor, even when it is not self-signed),
    and the name it was issued for is not checked against the address, which for a server bound
    to every interface is loopback. Without a certificate named, the system's trust store."""
    import ssl

    if record.tls_cert is None:
        return ssl.create_default_context()
    try:
        context = ssl.create_default_context(cafile=record.tls_cert)
    except (OSError, ssl.SSLError) as error:
        raise ServerUnreachable(
            record.url, f"its certificate {record.tls_cert} cannot be read: {error}"
        ) from None
    context.check_hostname = False
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    return context


def _error(method: str, path: str, status: int, document: object) -> Exception:
    """The exception for an error answer: its code's ``EngineError``, else ``ServerError``."""
    if not isinstance(document, dict) or not isinstance(document.get("code"), str):
        return ServerError(
            "bad_response", status, f"{method} {path}: an error answer without an error code"
        )
    code = document["code"]
    message = str(document.get("message") or code)
    raw = document.get("detail")
    detail: dict[str, object] = raw if isinstance(raw, dict) else {}
    if code in ERROR_CODES:
        return error_from_code(code, message, detail)
    return ServerError(code, status, message, detail)


def find_server(path: Path | None = None, timeout: float = 10.0) -> tuple[ServerClient | None, str]:
    """The client of the server that server.json (at ``path``, default the data folder's) names,
    when it runs and answers its health check as that pid; ``None`` otherwise.

    The text says where an answer comes from, one line: ``server http://127.0.0.1:7370 (pid
    4242)``, or ``this process: ...`` and why no server is asked.
    """
    path = path if path is not None else record_path()
    record, why = live_record(path)
    if record is None:
        return (
            None,
            f"this process: {why or f'no server running (no server.json in {path.parent})'}",
        )
    client = ServerClient(record, timeout=timeout)
    try:
        health = ServerClient(record, timeout=min(timeout, HEALTH_TIMEOUT)).get(HEALTH)
    except (ServerUnreachable, ServerError, EngineError) as error:
        return None, f"this process: {path} names pid {record.pid}, which {_silent(error)}"
    pid = health.get("pid") if isinstance(health, dict) else None
    if pid != record.pid:
        return None, (
            f"this process: {path} names pid {record.pid}, but {record.url} answers as pid {pid}"
        )
    return client, f"server {record.url} (pid {record.pid})"


def _silent(error: Exception) -> str:
    """Why a health check found no server of ours: no answer, or an error answer."""
    if isinstance(error, ServerUnreachable):
        return f"does not answer at {error.url} ({error.reason})"
    return f"answers {HEALTH} with [{getattr(error, 'code', '?')}] {error}"
