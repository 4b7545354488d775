"""The two classes an engine author subclasses.

``Engine`` is what the manifest's ``implementation`` names: its module is imported when the engine
is first used, and must not import torch at module level. ``Engine.load`` builds the model and
returns a ``LoadedEngine``, which answers the capabilities the manifest declares.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, ClassVar, cast

from mizuoto_sdk.errors import Unsupported
from mizuoto_sdk.manifest import EngineManifest
from mizuoto_sdk.parallel import ParallelConfig
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


class _FromManifest:
    """A class attribute whose value is the manifest's, so that an author declares it once.

    ``get_engine`` returns the class with the manifest's values bound (see
    ``mizuoto_sdk.discovery``); reading one on a class that did not come from there, and does not
    set it itself, says where the value lives instead of guessing one.
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, instance: object, owner: type) -> object:
        raise AttributeError(
            f"{owner.__name__}.{self.name} is the manifest's {self.name.lower()}: it is set on the "
            f"class that mizuoto_sdk.host.get_engine() returns (or set {self.name} on "
            f"{owner.__name__} yourself, equal to the manifest's)"
        )


class Engine:
    """An engine family.

    ``DEVICES``, ``DTYPES`` (preference order) and ``EXTRAS`` are the manifest's: the class that
    ``get_engine`` returns carries the manifest's values, so an author declares them once, in the
    manifest. A class may still set them; then they must equal the manifest's, or the engine is
    refused.
    """

    if TYPE_CHECKING:
        DEVICES: ClassVar[tuple[str, ...]]
        DTYPES: ClassVar[tuple[str, ...]]
        EXTRAS: ClassVar[Mapping[str, str]]
    else:
        DEVICES = _FromManifest()
        DTYPES = _FromManifest()
        EXTRAS = _FromManifest()

    @classmethod
    def validate_parallel(cls, parallel: ParallelConfig, replica_world_size: int) -> None:
        """Refuse a topology this engine cannot run, before any worker starts.

        The host calls it when a replica spans more than one rank (``replica_world_size`` =
        ``parallel.ranks``), after checking that every domain the config splits is declared in
        the manifest's ``parallel_domains``. The default accepts what the manifest declares.
        Override it to tighten, raising ``InvalidRequest`` with ``{"field":
        "engines.<id>.parallel"}`` and a message that names the limit, the numbers and the fix,
        e.g. a TP size that must divide the number of attention heads::

            @classmethod
            def validate_parallel(cls, parallel, replica_world_size):
                tp = parallel.resolved("attention").tp_size
                if HEADS % tp:
                    raise InvalidRequest(
                        f"engines.my-engine.parallel.attention.tp_size: {HEADS} heads do not "
                        f"split over {tp} ranks; use a divisor of {HEADS}",
                        {"field": "engines.my-engine.parallel"},
                    )

        It runs in the host process, so, like the module, it must not import torch.
        """

    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        raise NotImplementedError(f"{type(self).__name__}.load is not implemented")


MANIFEST_FACTS = ("DEVICES", "DTYPES", "EXTRAS")


def facts_set_by(engine_class: type[Engine]) -> set[str]:
    """Which of DEVICES, DTYPES and EXTRAS the class (or a base below Engine) sets itself."""
    below_engine = engine_class.__mro__[: engine_class.__mro__.index(Engine)]
    return {name for name in MANIFEST_FACTS if any(name in vars(k) for k in below_engine)}


def with_manifest_facts(engine_class: type[Engine], manifest: EngineManifest) -> type[Engine]:
    """``engine_class``, or a subclass that adds the manifest's values for what it leaves unset.

    A subclass, never an assignment on ``engine_class``: one class may serve two manifests (two
    engine ids with other devices, say), and each id's class must read its own manifest; values
    bound on the shared class would give the second id the first one's. The subclass keeps the
    class's name, module and docstring, so messages and ``isinstance`` read as before.
    """
    facts = {
        "DEVICES": manifest.devices,
        "DTYPES": manifest.dtypes,
        "EXTRAS": MappingProxyType(dict(manifest.extras)),
    }
    unset = {name: facts[name] for name in MANIFEST_FACTS if name not in facts_set_by(engine_class)}
    if not unset:
        return engine_class
    namespace = {
        **unset,
        "__module__": engine_class.__module__,
        "__qualname__": engine_class.__qualname__,
        "__doc__": engine_class.__doc__,
    }
    metaclass: type[type] = type(engine_class)
    made = metaclass(engine_class.__name__, (engine_class,), namespace)
    return cast("type[Engine]", made)
