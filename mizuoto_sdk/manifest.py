"""What a plugin declares about its engines, read without importing the engine itself."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any

import attrs

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.params import Param, check_declaration, check_params

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
_ID = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_IMPLEMENTATION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
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


def device_type(device: str) -> str:
    """``"cuda:1"`` -> ``"cuda"``; raises ValueError for anything that is not a known device."""
    if not isinstance(device, str):
        raise TypeError(f"device: expected a string such as 'cpu' or 'cuda:0', got {device!r}")
    kind, _, index = device.partition(":")
    if kind not in DEVICE_TYPES or (index and not index.isdigit()) or device.endswith(":"):
        raise ValueError(
            f"device: {device!r} is not a device; expected one of {', '.join(DEVICE_TYPES)}, "
            "optionally with an index such as 'cuda:0'"
        )
    return kind


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


def _matches(
    pattern: re.Pattern[str], example: str
) -> Callable[[object, attrs.Attribute[Any], object], None]:
    def check(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        if not isinstance(value, str) or not pattern.fullmatch(value):
            owner = type(instance).__name__
            raise ValueError(
                f"{owner}.{attribute.name}: expected something like {example!r}, got {value!r}"
            )

    return check


def _string_map(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise TypeError(
            f"extras: expected a mapping of import name -> pip requirement, got {value!r}"
        )
    return MappingProxyType(dict(value))


def _check_files(instance: ModelEntry, attribute: attrs.Attribute[Any], value: str | None) -> None:
    if value is not None:
        _check_files_value(value)


def _check_files_value(value: object) -> None:
    if not isinstance(value, str):
        raise ValueError(f"ModelEntry.files: expected a string, got {value!r}")
    package, sep, _ = value.partition(":")
    is_resource = sep and re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", package)
    if not (is_resource or value.startswith("/")):
        raise ValueError(
            f"ModelEntry.files: expected 'package:relative/dir' or an absolute path, got {value!r}"
        )


_SHA256 = re.compile(r"[0-9a-f]{64}")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_HUB_REPO = re.compile(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}")


def _check_path(instance: ModelFile, attribute: attrs.Attribute[Any], value: object) -> None:
    parts = value.split("/") if isinstance(value, str) else []
    if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in str(value):
        raise ValueError(
            "ModelFile.path: expected a relative path with '/' between folders, such as "
            f"'weights/model.safetensors', got {value!r}"
        )


def _check_size(instance: ModelFile, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"ModelFile.size: expected a byte count >= 0, got {value!r}")


def _check_url(instance: ModelFile, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not (
        isinstance(value, str) and re.fullmatch(r"https?://[^\s/]+/\S*", value)
    ):
        raise ValueError(f"ModelFile.url: expected an http:// or https:// URL, got {value!r}")


def _lower(value: object) -> object:
    return value.lower() if isinstance(value, str) else value


@attrs.frozen
class ModelFile:
    """One file of a model: its place in the model's folder, and what it must hold.

    ``size`` and ``sha256`` (64 hex digits) are checked before the model is used; ``url`` is where
    a ``UrlSource`` fetches it from.
    """

    path: str = attrs.field(validator=_check_path)
    size: int = attrs.field(validator=_check_size)
    sha256: str = attrs.field(converter=_lower, validator=_matches(_SHA256, "64 hex digits"))
    url: str | None = attrs.field(default=None, validator=_check_url)


def _file_list(values: Iterable[ModelFile]) -> tuple[ModelFile, ...]:
    items = tuple(values)
    if not all(isinstance(f, ModelFile) for f in items):
        raise ValueError(f"files: expected ModelFile items, got {items!r}")
    paths = [f.path for f in items]
    if len(set(paths)) != len(paths):
        raise ValueError(f"files: paths {paths} repeat")
    return items


def _some_files(instance: object, attribute: attrs.Attribute[Any], value: tuple[ModelFile]) -> None:
    if not value:
        raise ValueError(f"{type(instance).__name__}.files: list at least one ModelFile")


@attrs.frozen
class PackageSource:
    """Files shipped inside an installed package: ``"package:relative/dir"``.

    ``files`` is optional; when given, their sizes are checked before the model loads.
    """

    resource: str = attrs.field(
        validator=_matches(re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:.*"), "pkg:weights")
    )
    files: tuple[ModelFile, ...] = attrs.field(default=(), converter=_file_list)


@attrs.frozen
class FolderSource:
    """Files in a local folder (an absolute path) that the user puts there."""

    path: str = attrs.field(validator=_matches(re.compile(r"/.*"), "/srv/models/tiny"))
    files: tuple[ModelFile, ...] = attrs.field(default=(), converter=_file_list)


@attrs.frozen
class HubSource:
    """Files of a Hugging Face Hub repository at one commit (``revision``: 40 hex digits, so
    that the bytes never change under the same manifest), fetched by ``mizuoto models pull``."""

    repo: str = attrs.field(validator=_matches(_HUB_REPO, "owner/name"))
    revision: str = attrs.field(validator=_matches(_COMMIT, "a 40-hex-digit commit"))
    files: tuple[ModelFile, ...] = attrs.field(converter=_file_list, validator=_some_files)


def _check_urls(instance: UrlSource, attribute: attrs.Attribute[Any], value: object) -> None:
    missing = [f.path for f in instance.files if f.url is None]
    if missing:
        raise ValueError(f"UrlSource.files: {missing} have no url")


@attrs.frozen
class UrlSource:
    """Files fetched from their own ``url`` by ``mizuoto models pull``."""

    files: tuple[ModelFile, ...] = attrs.field(
        converter=_file_list, validator=[_some_files, _check_urls]
    )


ModelSource = PackageSource | FolderSource | HubSource | UrlSource
"""Where a model's files come from."""


def _source_of_files(entry: ModelEntry) -> ModelSource | None:
    if entry.files is None:
        return None
    _check_files_value(entry.files)  # before the source is made from it: name the field given
    if entry.files.startswith("/"):
        return FolderSource(entry.files)
    return PackageSource(entry.files)


def _check_source(instance: ModelEntry, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(
        value, PackageSource | FolderSource | HubSource | UrlSource
    ):
        raise ValueError(
            "ModelEntry.source: expected a PackageSource, FolderSource, HubSource or UrlSource, "
            f"got {value!r}"
        )
    if instance.files is not None and value != _source_of_files(instance):
        raise ValueError("ModelEntry: give files or source, not both")


@attrs.frozen
class ModelEntry:
    """One model an engine can load: its id and where its files are.

    ``source`` says where the files come from: a package resource, a local folder, a Hugging Face
    Hub repository at a pinned commit, or URLs, each file with its size and sha256 (the host
    fetches Hub and URL files into its model cache with ``mizuoto models pull``). ``files`` is the
    older spelling of the first two: ``"package:relative/dir"`` or an absolute path (it fills
    ``source``). None for both: a model without files. The host resolves the source into
    ``LoadSpec.model_dir``.
    """

    id: str = attrs.field(validator=_matches(_ID, "tiny"))
    files: str | None = attrs.field(default=None, validator=_check_files)
    variants: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    description: str = ""
    source: ModelSource | None = attrs.field(
        default=attrs.Factory(_source_of_files, takes_self=True), validator=_check_source
    )


def _models(values: Iterable[ModelEntry]) -> tuple[ModelEntry, ...]:
    items = tuple(values)
    if not items or not all(isinstance(m, ModelEntry) for m in items):
        raise ValueError(f"models: expected one or more ModelEntry, got {items!r}")
    ids = [m.id for m in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"models: model ids {ids} repeat")
    return items


def _reasons(value: Mapping[str, str]) -> Mapping[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and v.strip() for k, v in value.items()
    ):
        raise ValueError(
            "expected_failures: expected a mapping of contract check id -> a non-empty reason, "
            f"got {value!r}"
        )
    return MappingProxyType(dict(value))


def _command(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        owner = type(instance).__name__
        raise ValueError(
            f"{owner}.{attribute.name}: expected a non-empty string such as "
            f"'apt install espeak-ng', got {value!r}"
        )


def _system_name(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        owner = type(instance).__name__
        raise ValueError(
            f"{owner}.{attribute.name}: expected a name without spaces such as 'espeak-ng', "
            f"got {value!r}"
        )


_probe = attrs.validators.optional(_matches(_IMPLEMENTATION, "mizuoto_engine_x.checks:espeak_ok"))


@attrs.frozen
class Program:
    """A program the engine runs (``espeak-ng``, ``ffmpeg``) and the command that installs it.

    The host looks ``name`` up on PATH (``shutil.which``). ``probe``, ``"pkg.module:function"``,
    replaces that lookup with the engine's own check: a cheap function that must not import
    torch and returns None when the program is usable, else a sentence saying why not (too old,
    a voice missing). ``install`` is what the user is told to run when it is missing.
    """

    name: str = attrs.field(validator=_system_name)
    install: str = attrs.field(validator=_command)
    probe: str | None = attrs.field(default=None, validator=_probe)


@attrs.frozen
class Library:
    """A shared library the engine loads (``sndfile`` for libsndfile) and how to install it.

    The host looks ``name`` up as ``ctypes.util.find_library`` does (the name without ``lib``
    and suffix); ``probe`` and ``install`` are as for ``Program``.
    """

    name: str = attrs.field(validator=_system_name)
    install: str = attrs.field(validator=_command)
    probe: str | None = attrs.field(default=None, validator=_probe)


def _system_items(kind: str, cls: type[Any], values: Iterable[Any]) -> tuple[Any, ...]:
    items = (values,) if isinstance(values, str | cls) else tuple(values)
    wrong = [v for v in items if not isinstance(v, cls)]
    if wrong:
        raise ValueError(f"{kind}: expected {cls.__name__} values, got {wrong[0]!r}")
    names = [v.name for v in items]
    if len(set(names)) != len(names):
        raise ValueError(f"{kind}: {names} names one twice")
    return items


def _programs(values: Iterable[Program]) -> tuple[Program, ...]:
    return _system_items("programs", Program, values)


def _libraries(values: Iterable[Library]) -> tuple[Library, ...]:
    return _system_items("libraries", Library, values)


def _check_api_version(
    instance: EngineManifest, attribute: attrs.Attribute[Any], value: str
) -> None:
    parse_api_version(value)


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
    """

    id: str = attrs.field(validator=_matches(_ID, "my-engine"))
    implementation: str = attrs.field(validator=_matches(_IMPLEMENTATION, "pkg.engine:MyEngine"))
    models: tuple[ModelEntry, ...] = attrs.field(converter=_models)
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
    programs: tuple[Program, ...] = attrs.field(default=(), converter=_programs)
    libraries: tuple[Library, ...] = attrs.field(default=(), converter=_libraries)

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
