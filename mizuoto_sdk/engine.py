"""The two classes an engine author subclasses.

``Engine`` is what the manifest's ``implementation`` names: its module is imported when the engine
is first used, and must not import torch at module level. ``Engine.load`` builds the model and
returns a ``LoadedEngine``, which answers the capabilities the manifest declares.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

from mizuoto_sdk.errors import Unsupported
from mizuoto_sdk.manifest import DEVICE_TYPES
from mizuoto_sdk.types import AudioChunk, LoadSpec

if TYPE_CHECKING:
    from mizuoto_runtime.context import RequestContext
    from mizuoto_runtime.runtime import Runtime


class LoadedEngine:
    """A loaded model. Override the capabilities the manifest lists; the rest raise Unsupported.

    ``synthesize``, ``convert`` and ``edit`` return iterators of ``AudioChunk`` (write them as
    generators: the host runs them lazily and closes them when the caller stops early). Call
    ``ctx.check_cancel()`` between steps and draw randomness only from ``ctx.generator_for(device)``
    or ``ctx.rng``.
    """

    handles: tuple[object, ...] = ()

    def describe(self) -> Mapping[str, object]:
        """JSON-serialisable facts about what was loaded (shown by ``mizuoto runtime``)."""
        return {}

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        raise Unsupported(
            f"{type(self).__name__} does not synthesize", {"capability": "synthesize"}
        )

    def convert(
        self, audio: AudioChunk, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        raise Unsupported(f"{type(self).__name__} does not convert", {"capability": "convert"})

    def edit(
        self, audio: AudioChunk, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        raise Unsupported(f"{type(self).__name__} does not edit", {"capability": "edit"})

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: Path, params: Mapping[str, object], ctx: RequestContext
    ) -> Mapping[str, object]:
        raise Unsupported(
            f"{type(self).__name__} does not prepare voices", {"capability": "prepare_voice"}
        )

    def call(self, op: str, payload: Mapping[str, object], ctx: RequestContext) -> object:
        raise Unsupported(f"{type(self).__name__} has no operation {op!r}", {"capability": "call"})

    def unload(self) -> None:
        """Drop references to models and buffers; the host calls it before forgetting the engine."""
        self.handles = ()


class Engine:
    """An engine family. ``DEVICES``, ``DTYPES`` and ``EXTRAS`` must equal the manifest's."""

    DEVICES: ClassVar[tuple[str, ...]] = DEVICE_TYPES
    DTYPES: ClassVar[tuple[str, ...]] = ("float32",)
    EXTRAS: ClassVar[Mapping[str, str]] = {}

    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        raise NotImplementedError(f"{type(self).__name__}.load is not implemented")
