"""Finding engines: entry points -> plugin modules -> manifests, each plugin in isolation.

Listing imports only the torch-free plugin modules named by entry points. A plugin that fails to
import, misspells a hook, returns something other than manifests or speaks a newer engine API is
recorded with its reason, and every other plugin still loads. Two distributions that declare one
engine id are both marked ``conflict``: neither is used silently.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import logging
import os
import re
import reprlib
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import attrs
import pluggy

from mizuoto_sdk.engine import Engine, facts_set_by, with_manifest_facts
from mizuoto_sdk.errors import EngineNotFound, EngineUnavailable
from mizuoto_sdk.hooks import ENTRY_POINT_GROUP, HOOK_NAMES, PROJECT, EngineHooks
from mizuoto_sdk.manifest import API_VERSION, EngineManifest, canonical_dtype, parse_api_version

log = logging.getLogger(__name__)

Status = Literal["ok", "failed", "incompatible", "conflict"]
SELECTION_VARIABLE = "MIZUOTO_PLUGINS"


@attrs.frozen
class EngineRecord:
    """One row of ``mizuoto engines``: an engine (or a plugin that failed before naming one)."""

    id: str
    distribution: str
    version: str
    entry_point: str
    status: Status
    manifest: EngineManifest | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"


@attrs.frozen
class _Source:
    distribution: str
    version: str
    name: str
    value: str
    load: Callable[[], object]


def _constant(value: object) -> Callable[[], object]:
    return lambda: value


def normalize_name(name: str) -> str:
    """Distribution names compare as PEP 503 says: ``Mizuoto_Engine.X`` == ``mizuoto-engine-x``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _selection_from_environment() -> frozenset[str] | None:
    raw = os.environ.get(SELECTION_VARIABLE)
    if raw is None:
        return None
    return frozenset(normalize_name(p.strip()) for p in raw.split(",") if p.strip())


class Discovery:
    """The engines visible to this process, found once per instance.

    ``path`` replaces ``sys.path`` as the place to look for distributions; ``plugins`` registers
    in-process plugin objects (modules or instances) under a distribution name, as if they had been
    installed; ``selection`` (a set of distribution names, default ``MIZUOTO_PLUGINS``) limits
    which installed distributions load: unset loads all, an empty set none.
    """

    def __init__(
        self,
        *,
        path: Sequence[str] | None = None,
        plugins: Mapping[str, object] | None = None,
        entry_points: bool = True,
        selection: frozenset[str] | Literal["environment"] | None = "environment",
    ) -> None:
        self._path = list(path) if path is not None else None
        self._plugins = dict(plugins or {})
        self._entry_points = entry_points
        if selection == "environment":
            selection = _selection_from_environment()
        self._selection = None if selection is None else {normalize_name(s) for s in selection}
        self._records: tuple[EngineRecord, ...] | None = None
        self._classes: dict[str, type[Engine]] = {}

    def arguments(self) -> dict[str, Any]:
        """What another process passes to ``Discovery(**arguments)`` to find the same
        installed engines (a worker process does). In-process plugins cannot cross: see
        ``in_process``."""
        selection = None if self._selection is None else sorted(self._selection)
        return {"path": self._path, "entry_points": self._entry_points, "selection": selection}

    def in_process(self, engine_id: str) -> bool:
        """Whether ``engine_id`` comes from a plugin object registered with ``plugins=`` (which
        no other process can import) rather than from an installed distribution."""
        return self.record(engine_id).distribution in self._plugins

    def records(self) -> tuple[EngineRecord, ...]:
        """Every engine and every failed plugin, sorted by id."""
        if self._records is None:
            self._records = self._discover()
        return self._records

    def record(self, engine_id: str) -> EngineRecord:
        """The usable record for ``engine_id``; raises EngineNotFound or EngineUnavailable."""
        matches = [r for r in self.records() if r.id == engine_id and r.manifest is not None]
        if not matches:
            known = sorted({r.id for r in self.records() if r.ok})
            raise EngineNotFound(
                f"no engine {engine_id!r}; known engines: {', '.join(known) or 'none installed'}",
                {"field": "engine", "engine": engine_id, "known": known},
            )
        record = matches[0]
        if not record.ok:
            raise EngineUnavailable(
                f"engine {engine_id!r} is {record.status}: {record.error}",
                {"engine": engine_id, "status": record.status, "distribution": record.distribution},
            )
        return record

    def manifest(self, engine_id: str) -> EngineManifest:
        manifest = self.record(engine_id).manifest
        assert manifest is not None
        return manifest

    def get_engine(self, engine_id: str) -> type[Engine]:
        """Import the engine's implementation (never torch: that waits for ``load``).

        Whatever importing it does, sys.exit included, ends as EngineUnavailable with the reason.
        The class returned carries the manifest's ``DEVICES``, ``DTYPES`` and ``EXTRAS`` (see
        ``mizuoto_sdk.engine.with_manifest_facts``); the same class on every call of this
        Discovery.
        """
        manifest = self.manifest(engine_id)
        try:
            target = _import_implementation(manifest)
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # an implementation's import may even call sys.exit
            raise EngineUnavailable(
                f"engine {engine_id!r}: cannot import {manifest.implementation}: "
                f"{_describe(error)}",
                {"engine": engine_id, "traceback": traceback.format_exc()},
            ) from error
        engine_class = _check_engine_class(manifest, target)
        try:
            bound = with_manifest_facts(engine_class, manifest)
        except Exception as error:  # e.g. an __init_subclass__ that refuses subclasses
            raise EngineUnavailable(
                f"engine {engine_id!r}: cannot bind the manifest's values on "
                f"{manifest.implementation} ({_describe(error)}); set DEVICES, DTYPES and "
                "EXTRAS on the class, equal to the manifest's",
                {"engine": engine_id},
            ) from None
        return self._classes.setdefault(engine_id, bound)

    def _sources(self) -> Iterator[_Source]:
        for name, plugin in self._plugins.items():
            yield _Source(name, "0", name, repr(plugin), _constant(plugin))
        if not self._entry_points:
            return
        seen: set[str] = set()
        distributions = (
            importlib.metadata.distributions(path=self._path)
            if self._path is not None
            else importlib.metadata.distributions()
        )
        for dist in distributions:
            name = dist.metadata["Name"] or ""
            key = normalize_name(name)
            if key in seen:
                continue  # the same distribution further down the path is shadowed
            seen.add(key)
            if self._selection is not None and key not in self._selection:
                continue
            for ep in dist.entry_points.select(group=ENTRY_POINT_GROUP):
                yield _Source(name, dist.version, ep.name, ep.value, ep.load)

    def _discover(self) -> tuple[EngineRecord, ...]:
        manager = pluggy.PluginManager(PROJECT)
        manager.add_hookspecs(EngineHooks)
        records: list[EngineRecord] = []
        for source in self._sources():
            log.debug(
                "loading plugin %s from %s %s", source.value, source.distribution, source.version
            )
            records.extend(_load_plugin(manager, source))
        marked = _mark_conflicts(records)
        for record in marked:
            if not record.ok:  # one line; the record (and `mizuoto engines`) holds the rest
                reason = (record.error or "").splitlines()[0]
                log.warning(  # engine_record: a listing that shows the record can drop the line
                    "plugin %s (%s): %s",
                    record.distribution,
                    record.status,
                    reason,
                    extra={"engine_record": record},
                )
                log.debug("plugin %s: %s", record.distribution, record.error)
        return tuple(sorted(marked, key=lambda r: (r.id, r.distribution)))


def _load_plugin(manager: pluggy.PluginManager, source: _Source) -> list[EngineRecord]:
    """Import, register and call one plugin; whatever it raises becomes its ``failed`` record.

    Every step runs the plugin's code (its import, attribute lookups during registration, the
    hook, even the ``repr`` of what the hook returned), and any of them may raise anything,
    SystemExit included. Only KeyboardInterrupt (Ctrl-C, or the CLI's SIGTERM) passes through:
    it is the user stopping the command, not the plugin failing.
    """
    entry = f"{source.name} = {source.value}"
    name = f"{source.distribution}:{source.name}"
    plugin: object = None
    try:
        try:
            plugin = source.load()
        except KeyboardInterrupt:
            raise
        except BaseException as error:  # a plugin's import may even call sys.exit
            trace = traceback.format_exc()
            raise _PluginFailed(f"import failed: {_describe(error)}\n{trace}") from None
        return [_record(m, source, entry) for m in _manifests(manager, plugin, name)]
    except KeyboardInterrupt:
        raise
    except _PluginFailed as failure:
        reason = str(failure)
    except BaseException as error:
        reason = f"failed while loading: {_describe(error)}\n{traceback.format_exc()}"
    if plugin is not None and manager.get_plugin(name) is plugin:
        manager.unregister(name=name)  # a failed plugin leaves no hooks behind
    return [
        EngineRecord(
            source.name, source.distribution, source.version, entry, "failed", error=reason
        )
    ]


class _PluginFailed(Exception):
    """A plugin step failed; the message is the record's reason."""


def _manifests(manager: pluggy.PluginManager, plugin: object, name: str) -> list[EngineManifest]:
    try:
        manager.register(plugin, name=name)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # pluggy reads the plugin's attributes, which may run code
        raise _PluginFailed(f"registration failed: {_describe(error)}") from None
    try:
        manager.check_pending()
    except pluggy.PluginValidationError as error:
        raise _PluginFailed(f"{error}{_suggestion(plugin)}") from None
    impls = [i for i in manager.hook.mizuoto_engines.get_hookimpls() if i.plugin is plugin]
    if not impls:
        raise _PluginFailed(
            f"implements no Mizuoto hook (expected {', '.join(HOOK_NAMES)} marked "
            f"with @mizuoto_sdk.hookimpl){_suggestion(plugin)}"
        )
    try:
        returned = impls[0].function()
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # as isolated as the import: sys.exit here is a failure too
        raise _PluginFailed(
            f"mizuoto_engines raised {_describe(error)}\n{traceback.format_exc()}"
        ) from None
    manifests = [returned] if isinstance(returned, EngineManifest) else returned
    if not isinstance(manifests, (list, tuple)) or not all(
        isinstance(m, EngineManifest) for m in manifests
    ):
        raise _PluginFailed(
            f"mizuoto_engines returned {_safe_repr(returned)}; expected a list of EngineManifest"
        )
    return list(manifests)


def _describe(error: BaseException) -> str:
    """``"SystemExit: 3"``: the exception's type and message, even when its ``str`` fails."""
    try:
        message = str(error)
    except KeyboardInterrupt:
        raise
    except BaseException:
        message = "<the exception's message could not be read>"
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _safe_repr(value: object) -> str:
    try:
        return reprlib.repr(value)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return f"a {type(value).__name__} object"


def _record(manifest: EngineManifest, source: _Source, entry: str) -> EngineRecord:
    major, minor = parse_api_version(manifest.api_version)
    our_major, our_minor = parse_api_version(API_VERSION)
    if major != our_major:
        return EngineRecord(
            manifest.id,
            source.distribution,
            source.version,
            entry,
            "incompatible",
            manifest,
            f"declares engine API {manifest.api_version}, but this mizuoto-sdk speaks API "
            f"{our_major}.x (up to {API_VERSION}); it needs a mizuoto-sdk release for API "
            f"{major}.x, or a release of {source.distribution} built for API {our_major}.x",
        )
    if minor > our_minor:
        log.warning(
            "%s declares engine API %s, newer than %s: features it expects may be missing",
            manifest.id,
            manifest.api_version,
            API_VERSION,
        )
    return EngineRecord(manifest.id, source.distribution, source.version, entry, "ok", manifest)


def _mark_conflicts(records: list[EngineRecord]) -> list[EngineRecord]:
    by_id: dict[str, list[EngineRecord]] = {}
    for record in records:
        if record.manifest is not None:
            by_id.setdefault(record.id, []).append(record)
    result = [r for r in records if r.manifest is None]
    for engine_id, group in by_id.items():
        if len(group) == 1:
            result.extend(group)
            continue
        for record in group:
            others = [
                f"{o.distribution} {o.version} ({o.entry_point})" for o in group if o is not record
            ]
            result.append(
                attrs.evolve(
                    record,
                    status="conflict",
                    error=f"engine id {engine_id!r} is also declared by {'; '.join(others)}: "
                    "uninstall one of them",
                )
            )
    return result


def _suggestion(plugin: object) -> str:
    names = [n for n in dir(plugin) if n.startswith(PROJECT) and n not in HOOK_NAMES]
    hints = [
        f"{n!r} -> did you mean {m[0]!r}?"
        for n in names
        if (m := difflib.get_close_matches(n, HOOK_NAMES, n=1))
    ]
    return f" ({'; '.join(hints)})" if hints else ""


def _import_implementation(manifest: EngineManifest) -> object:
    module_name, _, qualname = manifest.implementation.partition(":")
    target: object = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as error:  # a misspelt class name: suggest the closest one
            close = difflib.get_close_matches(part, dir(target), n=1)
            if not close:
                raise
            raise AttributeError(f"{error}; did you mean {close[0]!r}?") from error
    return target


def _check_engine_class(manifest: EngineManifest, target: object) -> type[Engine]:
    """``target`` when it is an Engine subclass that agrees with ``manifest``."""
    if not (isinstance(target, type) and issubclass(target, Engine)):
        raise EngineUnavailable(
            f"engine {manifest.id!r}: {manifest.implementation} is {_safe_repr(target)}, not a "
            "subclass of mizuoto_sdk.Engine",
            {"engine": manifest.id},
        )
    declared: dict[str, tuple[Callable[[Any], object], object]] = {
        "DEVICES": (tuple, manifest.devices),
        "DTYPES": (lambda dtypes: tuple(canonical_dtype(d) for d in dtypes), manifest.dtypes),
        "EXTRAS": (dict, dict(manifest.extras)),
    }
    for name, (read, in_manifest) in declared.items():
        if name not in facts_set_by(target):
            continue  # the manifest's value is bound on the class get_engine returns
        try:
            on_class = read(getattr(target, name))
        except Exception as error:  # e.g. a dtype the SDK does not know, or a number
            raise EngineUnavailable(
                f"engine {manifest.id!r}: {target.__name__}.{name} is not valid: "
                f"{_describe(error)}; the manifest declares {in_manifest!r}",
                {"engine": manifest.id, "field": name.lower()},
            ) from None
        if on_class != in_manifest:
            raise EngineUnavailable(
                f"engine {manifest.id!r}: {target.__name__}.{name} = {on_class!r} but the manifest "
                f"declares {in_manifest!r}; make them equal",
                {"engine": manifest.id, "field": name.lower()},
            )
    return target


def discover(**options: Any) -> Discovery:
    """The engines installed in this environment (see ``Discovery`` for the options)."""
    return Discovery(**options)


def get_engine(engine_id: str) -> type[Engine]:
    """Import and return the ``Engine`` class for ``engine_id`` from the installed plugins."""
    return Discovery().get_engine(engine_id)
