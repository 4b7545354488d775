"""What a plugin declares about its engines, read without importing the engine itself."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from mizuoto_sdk._checks import ENGINE_ID as _ID
from mizuoto_sdk._checks import IMPLEMENTATION as _IMPLEMENTATION
from mizuoto_sdk._checks import matches as _matches
from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.model_files import (
    FolderSource,
    HubSource,
    ModelEntry,
    ModelFile,
    ModelSource,
    PackageSource,
    UrlSource,
    models_of,
)
from mizuoto_sdk.parallel import PARALLEL_DOMAINS
from mizuoto_sdk.params import Param, check_declaration, check_params
from mizuoto_sdk.system import Library, Program, libraries_of, programs_of

# ModelEntry and its sources, Program and Library live in their own modules; they stay importable
# from here, where a manifest's parts have always been.
__all__ = [
    "API_VERSION",
    "CAPABILITIES",
    "DEVICE_TYPES",
    "DTYPES",
    "EngineManifest",
    "FolderSource",
    "HubSource",
    "Library",
    "ModelEntry",
    "ModelFile",
    "ModelSource",
    "PackageSource",
    "Program",
    "UrlSource",
    "canonical_device",
    "canonical_dtype",
    "device_type",
    "parse_api_version",
]

API_VERSION = "1.0"
"""The engine API this SDK speaks: a manifest with another major version is incompatible."""

DEVICE_TYPES: tuple[str, ...] = ("cpu", "cuda", "mps", "xpu")
DTYPES: tuple[str, ...] = ("float32", "float16", "bfloat16")
CAPABILITIES: tuple[str, ...] = ("synthesize", "convert", "edit", "prepare_voice", "call")

_DTYPE_ALIASES = {
    "fp32": "float32",
    "float": "float32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
}
_VERSION = re.compile(r"(\d+)\.(\d+)")


def canonical_dtype(name: str) -> str:
    """``"bf16"`` -> ``"bfloat16"``; raises ValueError naming the accepted spellings."""
    if not isinstance(name, str):
        raise TypeError(f"dtype: expected a string such as 'float32', got {type(name).__name__}")
    value = _DTYPE_ALIASES.get(name.lower(), name.lower())
    if value not in DTYPES:
        accepted = ", ".join([*DTYPES, *_DTYPE_ALIASES])
        raise ValueError(f"dtype: unknown dtype {name!r}; expected one of {accepted}")
    return value


_DEVICE = re.compile(r"(?P<kind>[a-z]+)(?::(?P<index>[0-9]{1,6}))?")
_ONE_DEVICE = ("cpu", "mps")  # a machine has one of each: every index names the same device


def canonical_device(device: str) -> str:
    """The one spelling of ``device`` that every layer keys models by.

    ``"cuda:01"`` -> ``"cuda:1"``; ``"cpu:0"``, ``"cpu:7"`` -> ``"cpu"`` (torch ignores a CPU
    index: all name the one CPU, so they must not load copies of one model); ``"mps:0"`` ->
    ``"mps"``. ``"cuda"`` stays the current CUDA device, as torch reads it. Raises TypeError for a
    non-string and ValueError for anything that is not a device of a known type (another
    index on mps, a sign, letters, a missing index after ``:``).
    """
    if not isinstance(device, str):
        raise TypeError(f"device: expected a string such as 'cpu' or 'cuda:0', got {device!r}")
    match = _DEVICE.fullmatch(device)
    if match is None or match["kind"] not in DEVICE_TYPES:
        raise ValueError(
            f"device: {device!r} is not a device; expected one of {', '.join(DEVICE_TYPES)}, "
            "optionally with an index such as 'cuda:0'"
        )
    kind, index = match["kind"], match["index"]
    if index is None or kind == "cpu":
        return kind
    if kind in _ONE_DEVICE and int(index) != 0:
        raise ValueError(f"device: {device!r} is not a device; {kind} has only {kind}:0")
    return kind if kind in _ONE_DEVICE else f"{kind}:{int(index)}"


def device_type(device: str) -> str:
    """``"cuda:1"`` -> ``"cuda"``; raises ValueError for anything that is not a known device."""
    return canonical_device(device).partition(":")[0]


def parse_api_version(version: str) -> tuple[int, int]:
    match = _VERSION.fullmatch(version) if isinstance(version, str) else None
    if match is None:
        raise ValueError(
            f"api_version: expected 'MAJOR.MINOR' such as {API_VERSION!r}, got {version!r}"
        )
    return int(match[1]), int(match[2])


def _names(
    kind: str,
    allowed: tuple[str, ...],
    values: Iterable[str],
    canonical: Callable[[str], str] | None = None,
) -> tuple[str, ...]:
    if isinstance(values, str):
        values = (values,)
    try:
        items = tuple(v if canonical is None else canonical(v) for v in values)
    except (TypeError, ValueError) as error:
        raise ValueError(f"{kind}: {error}") from None
    unknown = [v for v in items if v not in allowed]
    if unknown:
        raise ValueError(f"{kind}: unknown {unknown}; expected some of {', '.join(allowed)}")
    if not items:
        raise ValueError(f"{kind}: must not be empty")
    if len(set(items)) != len(items):
        raise ValueError(f"{kind}: {list(items)} lists a value twice")
    return items


def _capabilities(values: Iterable[str]) -> tuple[str, ...]:
    return _names("capabilities", CAPABILITIES, values)


def _devices(values: Iterable[str]) -> tuple[str, ...]:
    return _names("devices", DEVICE_TYPES, values)


def _dtypes(values: Iterable[str]) -> tuple[str, ...]:
    return _names("dtypes", DTYPES, values, canonical_dtype)


def _string_map(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError(
            f"extras: expected a mapping of import name -> pip requirement, got {value!r}"
        )
    return MappingProxyType(dict(value))


def _reasons(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in value.items()
    ):
        raise ValueError(
            "expected_failures: expected a mapping of contract check id -> a non-empty reason, "
            f"got {value!r}"
        )
    return MappingProxyType(dict(value))


def _parallel_domains(values: Iterable[str]) -> tuple[str, ...]:
    return _names("parallel_domains", PARALLEL_DOMAINS, values) if values else ()


def _check_api_version(
    instance: EngineManifest, attribute: attrs.Attribute[Any], value: str
) -> None:
    parse_api_version(value)


def _check_max_concurrency(
    instance: object, attribute: attrs.Attribute[Any], value: object
) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ValueError(
            "max_concurrency: expected a whole number >= 1 (calls one loaded model runs at once), "
            f"or None for no limit; got {value!r}"
        )


def _check_sample_text(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ValueError(f"sample_text: expected some words, or None; got {value!r}")


@attrs.frozen
class EngineManifest:
    """Everything the host needs to list, select and later import an engine.

    A plugin module returns these from its ``mizuoto_engines`` hook. ``implementation`` names the
    ``Engine`` subclass as ``"package.module:Class"``; it is imported only when the engine is used.
    ``dtypes`` is in preference order. ``stochastic`` says that a different seed changes the output.
    ``expected_failures`` maps contract check ids the engine knowingly fails to the reason why.
    ``sample_text`` is the input the contract suite speaks (None: its own three sentences); name
    one that exercises what your engine streams by, e.g. several sentences for a sentence-chunker.
    ``uses_torch=False`` says the engine never imports torch (it wraps a program or uses numpy):
    the host then loads and calls it without the runtime, also where torch is not installed.
    ``params`` declares the request params the engine reads (see ``Param``); the host checks
    each request against them. A manifest that declares none gets its requests' params as given.
    ``programs`` and ``libraries`` name what the engine needs beyond Python packages (see
    ``Program``, ``Library``): ``mizuoto engines`` and ``mizuoto doctor`` report the missing ones
    with their install command, and loading the engine fails with ``engine_unavailable``.
    ``parallel_domains`` names the parts of ``mizuoto_sdk.parallel.PARALLEL_DOMAINS`` the engine
    can split across ranks (``("dense", "attention")``); a config that splits any other is
    refused before a worker starts. None declared: one rank per replica.
    ``deterministic=False`` says one seed may give other audio on another call (a backend whose
    kernels or library cannot be made reproducible): the contract suite then checks that calls
    succeed, at once too, instead of comparing their audio.
    ``max_concurrency`` is how many calls one loaded model may run at once (None: any number).
    An engine around a library that is not thread-safe declares 1: every host (inline, worker,
    agent, server) then queues the calls of each loaded model, a stream holding its turn from its
    first chunk to its end; a queued call's cancel and timeout still end it.
    ``text_input=True`` says the streaming capability reads text streamed in
    (``EngineRequest.text_input``, through ``mizuoto_runtime.text.streamed.sentences``): servers
    then feed it the pieces as they come instead of cutting the text into sentences themselves,
    and the contract suite checks that text fed in pieces gives the whole text's audio.
    """

    id: str = attrs.field(validator=_matches(_ID, "my-engine"))
    implementation: str = attrs.field(validator=_matches(_IMPLEMENTATION, "pkg.engine:MyEngine"))
    models: tuple[ModelEntry, ...] = attrs.field(converter=models_of)
    capabilities: tuple[str, ...] = attrs.field(converter=_capabilities)
    name: str = attrs.field(default=attrs.Factory(lambda self: self.id, takes_self=True))
    devices: tuple[str, ...] = attrs.field(default=DEVICE_TYPES, converter=_devices)
    dtypes: tuple[str, ...] = attrs.field(default=("float32",), converter=_dtypes)
    extras: Mapping[str, str] = attrs.field(factory=dict, converter=_string_map, hash=False)
    api_version: str = attrs.field(default=API_VERSION, validator=_check_api_version)
    stochastic: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    expected_failures: Mapping[str, str] = attrs.field(factory=dict, converter=_reasons, hash=False)
    description: str = ""
    sample_text: str | None = attrs.field(default=None, validator=_check_sample_text)
    uses_torch: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    params: tuple[Param, ...] = attrs.field(default=(), converter=check_declaration)
    programs: tuple[Program, ...] = attrs.field(default=(), converter=programs_of)
    libraries: tuple[Library, ...] = attrs.field(default=(), converter=libraries_of)
    parallel_domains: tuple[str, ...] = attrs.field(default=(), converter=_parallel_domains)
    max_concurrency: int | None = attrs.field(default=None, validator=_check_max_concurrency)
    deterministic: bool = attrs.field(default=True, validator=attrs.validators.instance_of(bool))
    text_input: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))

    def model(self, model_id: str | None) -> ModelEntry:
        """The entry for ``model_id`` (None: the first one); unknown ids name the known ones."""
        if model_id is None:
            return self.models[0]
        for entry in self.models:
            if entry.id == model_id:
                return entry
        known = ", ".join(m.id for m in self.models)
        raise InvalidRequest(
            f"engine {self.id!r} has no model {model_id!r}; known models: {known}",
            {"field": "model", "known": [m.id for m in self.models]},
        )

    def check_params(self, params: Mapping[str, object]) -> Mapping[str, object]:
        """A request's params as the engine gets them: checked against ``params``, every
        declared one present (its default when not given), ``seed`` kept when given.

        An unknown name, or a value of the wrong type or outside its range, is an InvalidRequest
        naming ``params.<name>``. A manifest that declares no params (one written before they
        could be declared) gets ``params`` back as given, unchecked.
        """
        if not self.params:
            return params
        return check_params(self.params, params, self.id)
