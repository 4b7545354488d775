"""A model an engine can load (ModelEntry) and where its files come from: a package, a folder,
a Hugging Face Hub repository at a pinned commit, or URLs, each file with its size and sha256."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import attrs

from mizuoto_sdk._checks import ENGINE_ID as _ID
from mizuoto_sdk._checks import matches as _matches

__all__ = [
    "FolderSource",
    "HubSource",
    "ModelEntry",
    "ModelFile",
    "ModelSource",
    "PackageSource",
    "UrlSource",
]


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


def _required_files(value: object) -> tuple[str, ...]:
    """File names a local model folder must hold, each a relative path as ``ModelFile.path``."""
    items = (value,) if isinstance(value, str) else value
    if not isinstance(items, Iterable):
        raise ValueError(f"ModelEntry.required_files: expected file names, got {value!r}")
    names = tuple(items)
    for name in names:
        parts = name.split("/") if isinstance(name, str) else []
        if not parts or any(p in ("", ".", "..") for p in parts) or "\\" in name:
            raise ValueError(
                "ModelEntry.required_files: expected relative paths with '/' between folders, "
                f"such as 'config.json', got {name!r}"
            )
    return names


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
    ``LoadSpec.model_dir``. The setting ``engines.<id>.model_dir`` replaces the source of the
    engine's current model with a folder of the user's that holds ``required_files``.
    """

    id: str = attrs.field(validator=_matches(_ID, "tiny"))
    files: str | None = attrs.field(default=None, validator=_check_files)
    variants: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    description: str = ""
    source: ModelSource | None = attrs.field(
        default=attrs.Factory(_source_of_files, takes_self=True), validator=_check_source
    )
    required_files: tuple[str, ...] = attrs.field(default=(), converter=_required_files)
    """The files a folder must hold to stand in for this model (``config.json``, ...): checked
    when the setting ``engines.<id>.model_dir`` points the engine at a folder of the user's."""


def models_of(values: Iterable[ModelEntry]) -> tuple[ModelEntry, ...]:
    items = tuple(values)
    if not items or not all(isinstance(m, ModelEntry) for m in items):
        raise ValueError(f"models: expected one or more ModelEntry, got {items!r}")
    ids = [m.id for m in items]
    if len(set(ids)) != len(ids):
        raise ValueError(f"models: model ids {ids} repeat")
    return items
