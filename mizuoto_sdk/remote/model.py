"""The handle of a model on an agent elsewhere: a ``ReplicatedModel`` over one ``RemoteReplica``.

It answers the calls of a local model. Two things differ because a path means nothing on the
other machine: a param the manifest declares as a ``path`` is sent by content (``have`` asks
which files the agent lacks, ``put`` sends them), and ``prepare_voice`` receives the files the
engine wrote on the agent as ``file`` frames into a folder of this machine, which appears only
when the call succeeds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.frames import Frame, FrameError
from mizuoto_sdk.remote.files import put_frames, relative_path, upload_for
from mizuoto_sdk.serving import exchange
from mizuoto_sdk.serving.handle import ReplicatedModel

if TYPE_CHECKING:
    from mizuoto_sdk.manifest import EngineManifest
    from mizuoto_sdk.remote.client import RemoteReplica
    from mizuoto_sdk.request import EngineRequest
    from mizuoto_sdk.types import AudioChunk

__all__ = ["RemoteModel", "Stage"]

Stage = Callable[[Path, str], tuple[Path, Path]]
"""``(target, field) -> (folder, staging)``: where a result folder goes, and an empty folder
beside it to fill first (``mizuoto_sdk.host.paths.staged_folder``)."""


class RemoteModel(ReplicatedModel):
    """A model served by a ``mizuoto agent`` (``mode == "remote"``); ``host`` names the agent.

    The session starts on the first request, or on ``start()``; a session that was lost (the
    agent went silent, the connection dropped) is made again by the next request. ``start()``
    failing does not close the handle: fix the agent and call again.
    """

    mode = "remote"

    def __init__(
        self, name: str, manifest: EngineManifest, replica: RemoteReplica, stage: Stage
    ) -> None:
        super().__init__(name, manifest, [replica])
        self.host = replica.host.name
        self._remote = replica
        self._stage = stage

    def start(self) -> RemoteModel:
        if self.closed:
            raise self._closed()
        self._remote.start()
        return self

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: str | Path, request: EngineRequest | None = None
    ) -> dict[str, object]:
        """Let the engine on the agent make a voice; its files arrive in ``voice_dir`` (on this
        machine), which appears only if the call succeeds."""
        self._supports("prepare_voice")
        fields, payload = self._audio(audio)
        if not isinstance(voice_dir, str | os.PathLike):
            raise self._invalid("voice_dir", f"expected a folder path, got {voice_dir!r}")
        header: dict[str, object] = {"capability": "prepare_voice", "audio": fields}
        request = self._request(request, header)
        target, staging = self._stage(Path(os.path.abspath(voice_dir)), "voice_dir")
        self._begin(request)  # counted, so that a retired model closes after it, not before
        try:
            frame = exchange.run(self._route(), header, payload, request, files=_Receiver(staging))
            with contextlib.suppress(FileNotFoundError):
                target.rmdir()
            os.replace(staging, target)
        finally:
            self._end()
            shutil.rmtree(staging, ignore_errors=True)
        value = frame.header.get("value")
        return dict(value) if isinstance(value, dict) else {}

    def _request(self, request: EngineRequest | None, header: dict[str, object]) -> EngineRequest:
        """The base checks; the session started, within the request's timeout when it has one;
        then each path param that names a file or folder here is sent by content and replaced,
        in the header only, by its ``mizuoto-file:`` reference."""
        request = super()._request(request, header)
        self._remote.start(request.timeout)
        paths = {p.name for p in self.manifest.params if p.type == "path"}
        params = dict(request.params)
        for name, value in request.params.items():
            if name in paths and isinstance(value, str | os.PathLike) and os.path.exists(value):
                params[name] = self._upload(Path(value))
        header["params"] = params
        return request

    def _upload(self, path: Path) -> str:
        upload = upload_for(path)
        refs = [ref for ref, _ in upload.files]
        missing = self._remote.ask("have", [({"files": refs}, b"")]).header.get("missing")
        sent: set[object] = set()
        for ref, source in upload.files:
            if ref["sha256"] in (missing or ()) and ref["sha256"] not in sent:
                sent.add(ref["sha256"])
                self._remote.ask("put", put_frames(ref, source))
        return upload.value


class _Receiver:
    """Writes the ``file`` frames of a remote ``prepare_voice`` into its staging folder."""

    def __init__(self, staging: Path) -> None:
        self._staging = staging

    def __call__(self, frame: Frame) -> None:
        header = frame.header
        try:
            name = relative_path(header.get("name"), "name")
        except InvalidRequest as error:
            raise FrameError(f"a file frame's {error.message}") from None
        offset, size = header.get("offset", 0), header.get("size")
        if not _natural(offset) or not _natural(size) or offset + len(frame.payload) > size:
            raise FrameError(f"a file frame for {name} has offset {offset!r} and size {size!r}")
        path = self._staging.joinpath(*name.parts)
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "r+b" if path.exists() else "wb") as file:
            file.seek(offset)
            file.write(frame.payload)


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
