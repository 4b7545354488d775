"""The engine under test, and the ways a check drives it: through the host, or directly.

Through the host is how the Mizuoto server runs an engine. Directly (the LoadedEngine's own
methods, in inference mode with a context bound, as the host would) shows what the engine itself
does, before the host's own guards (lazy streaming, cancel between chunks, input validation).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator, Mapping
from typing import Any

import attrs

from mizuoto_contract.registry import Fail, Skip
from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import AudioChunk, Discovery, EngineError, EngineManifest, EngineRecord
from mizuoto_sdk.host import EngineRequest, LocalHandle, RuntimeService

STREAMING = ("synthesize", "convert", "edit")
SEED = 1234
TEXT = "Mizuoto checks every engine with this sentence, one word after another, to the end."


def sample_audio(seconds: float = 0.5, sample_rate: int = 16_000) -> AudioChunk:
    """A deterministic input for convert and edit: a 220 Hz tone."""
    import numpy as np

    t = np.arange(round(seconds * sample_rate), dtype=np.float32) / sample_rate
    return AudioChunk((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), sample_rate)


class NotLoadable(Skip):
    """The model does not load, so a check that needs it cannot run; ``error`` says why.

    One cause is reported once, by load.device (or discovery.class_matches_manifest when the
    Engine class is at fault), instead of as a crash in every check that loads.
    """

    def __init__(self, message: str, error: EngineError) -> None:
        super().__init__(message)
        self.error = error


@attrs.define
class Subject:
    """One engine on one device, with fresh hosts on demand."""

    engine_id: str
    device: str
    record: EngineRecord
    discovery: Discovery

    @property
    def manifest(self) -> EngineManifest:
        assert self.record.manifest is not None
        return self.record.manifest

    @property
    def capability(self) -> str | None:
        """The streaming capability the checks exercise (synthesize first), or None."""
        return next((c for c in STREAMING if c in self.manifest.capabilities), None)

    def service(self) -> RuntimeService:
        return RuntimeService(discovery=self.discovery)

    def load(self, service: RuntimeService | None = None) -> LocalHandle:
        """A freshly loaded model (a new host each time unless ``service`` is given).

        Raises NotLoadable (a Skip) when loading fails with an EngineError.
        """
        try:
            return (service or self.service()).loaded(self.engine_id, device=self.device)
        except EngineError as error:
            culprit = "load.device" if self._class_usable() else "discovery.class_matches_manifest"
            raise NotLoadable(
                f"not run: {self.engine_id} does not load on {self.device} (see {culprit}): "
                f"[{error.code}] {error}",
                error,
            ) from error

    def _class_usable(self) -> bool:
        try:
            self.discovery.get_engine(self.engine_id)
        except EngineError:
            return False
        return True

    def arguments(self, text: str = TEXT) -> tuple[Any, ...]:
        """The inputs of ``capability``, before params."""
        return {
            "synthesize": (text,),
            "convert": (sample_audio(),),
            "edit": (sample_audio(), text),
        }[self.capability or "synthesize"]

    def stream(
        self, handle: LocalHandle, request: EngineRequest | None = None, text: str = TEXT
    ) -> Iterator[AudioChunk]:
        """The host's stream of the checked capability."""
        method = getattr(handle, self.capability or "synthesize")
        return method(*self.arguments(text), request)

    def audio(self, handle: LocalHandle, seed: int, text: str = TEXT) -> bytes:
        """All of a seeded stream's samples, as bytes, through the host."""
        import numpy as np

        chunks = [
            c.samples for c in self.stream(handle, EngineRequest(params={"seed": seed}), text)
        ]
        return np.concatenate(chunks).tobytes() if chunks else b""

    def close_early(self, handle: LocalHandle) -> EngineError | None:
        """Take one chunk of a seeded stream, then close it; the error closing raised, if any.

        A failing close is stream.early_close's to report; the other checks that abort streams
        carry on past it.
        """
        stream = self.stream(handle, EngineRequest(params={"seed": SEED}))
        next(stream)
        try:
            stream.close()
        except EngineError as error:
            return error
        return None

    def cancel_midway(self, handle: LocalHandle) -> bool:
        """Take one chunk, cancel, drain; True when the stream ended in CancelledError.

        Another EngineError instead (an engine that replaces the cancel) is False too: stream.cancel
        reports it, and the other checks that cancel carry on past it.
        """
        from mizuoto_sdk import CancelledError

        request = EngineRequest(params={"seed": SEED})
        stream = self.stream(handle, request)
        next(stream)
        request.cancel()
        time.sleep(0.05)  # the host's watcher forwards a cancel within 20 ms
        try:
            for _ in stream:
                pass
        except CancelledError:
            return True
        except EngineError:
            return False
        return False

    @contextlib.contextmanager
    def direct(self, ctx: RequestContext) -> Iterator[None]:
        """Run engine code as the host would: inference mode, context bound."""
        import torch

        with torch.inference_mode(), ctx.bind():
            yield

    def engine_stream(
        self,
        handle: LocalHandle,
        ctx: RequestContext,
        params: Mapping[str, object] | None = None,
        text: str = TEXT,
    ) -> object:
        """What the engine's own method returns (no host in between)."""
        method = getattr(handle.loaded, self.capability or "synthesize")
        with self.direct(ctx):
            return method(*self.arguments(text), dict(params or {}), ctx)

    def in_child(self, body: str, expected: str, timeout: float = 600) -> object:
        """Run ``body`` in a fresh interpreter that sees the same plugins; the JSON value its
        last line prints. A failing child is a Fail saying ``expected`` and its last error line."""
        script = "import json, sys, time\n" + textwrap.dedent(body)
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
        done = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=environment,
            check=False,
        )
        if done.returncode != 0:
            last = done.stderr.strip().splitlines()[-1:] or ["no output"]
            raise Fail(expected, f"exit {done.returncode}: {last[0]}")
        return json.loads(done.stdout.strip().splitlines()[-1])


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]
