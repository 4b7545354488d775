"""The model cache: where each model's files are, whether they are whole, pulling and removing.

Hub and URL models live in ``<cache>/<engine>/<model>/``. The cache is the setting
``models.cache``, else ``$MIZUOTO_HOME/models``, else ``models`` in the platform's user data
folder. A pull fills ``<cache>/<engine>/.<model>.partial/`` (kept when the pull stops, so the next
one resumes), checks every file's size and sha256 there, and only then renames the folder into
place: a model folder that exists is whole, and a failed pull never leaves one that loads half.
Package and folder models are where their manifest says; they are checked, never fetched.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Literal

import attrs

from mizuoto_sdk.errors import EngineUnavailable, ModelNotInstalled
from mizuoto_sdk.host.fetch import Fail, check_file, download, from_hub
from mizuoto_sdk.host.settings import Settings
from mizuoto_sdk.manifest import (
    EngineManifest,
    FolderSource,
    HubSource,
    ModelEntry,
    ModelFile,
    PackageSource,
    UrlSource,
)

HOME_VARIABLE = "MIZUOTO_HOME"
State = Literal["installed", "missing", "corrupt"]
Progress = Callable[[str, int, int], None]
"""Told ``(file path, bytes done, bytes in all)`` of the model as a pull goes on."""


def data_home() -> Path:
    """``$MIZUOTO_HOME``, else the platform's user data folder for mizuoto."""
    if home := os.environ.get(HOME_VARIABLE):
        return Path(home).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_data_dir("mizuoto", appauthor=False))


def model_cache(settings: Settings | None = None) -> Path:
    """The folder Hub and URL models are pulled into (setting ``models.cache``)."""
    configured = settings.get("models.cache") if settings is not None else None
    return Path(configured) if configured else data_home() / "models"


def local_folder(settings: Settings, manifest: EngineManifest, entry: ModelEntry) -> Path | None:
    """The folder of ``engines.<id>.model_dir`` when ``entry`` is the engine's current model
    (the one its ``model`` setting names, else its first); None otherwise."""
    folder = settings.engine(manifest.id, "model_dir")
    if folder is None or manifest.model(settings.engine(manifest.id, "model")) != entry:
        return None
    return Path(folder)


def pull_command(engine_id: str, model_id: str) -> str:
    return f"mizuoto models pull {engine_id}:{model_id}"


@attrs.frozen
class ModelStatus:
    """One model's files: ``state`` installed, missing or corrupt (``problems`` say why)."""

    engine: str
    model: str
    source: str  # package, folder, hub, url, none, or local (the setting engines.<id>.model_dir)
    state: State
    folder: Path | None
    size: int  # bytes declared by the manifest's files
    problems: tuple[str, ...] = ()

    @property
    def pullable(self) -> bool:
        return self.source in ("hub", "url")

    def to_dict(self) -> dict[str, object]:
        return {**attrs.asdict(self), "folder": None if self.folder is None else str(self.folder)}


class ModelStore:
    """The models of one cache folder (see the module docstring for its layout)."""

    def __init__(self, cache: Path) -> None:
        self.cache = Path(cache)

    def folder(self, engine_id: str, entry: ModelEntry) -> Path | None:
        """Where ``entry``'s files are, or would be once pulled (None: a model without files)."""
        source = entry.source
        if source is None:
            return None
        if isinstance(source, FolderSource):
            return Path(source.path)
        if isinstance(source, PackageSource):
            return _package_folder(source, entry, engine_id)
        return self.cache / engine_id / entry.id

    def status(self, engine_id: str, entry: ModelEntry, verify: bool = False) -> ModelStatus:
        """Sizes are always checked; sha256 only with ``verify`` (it reads every byte)."""
        source = entry.source
        kind = _kind(source)
        files = () if source is None else source.files
        size = sum(f.size for f in files)
        if source is None:
            return ModelStatus(engine_id, entry.id, kind, "installed", None, 0)
        try:
            folder = self.folder(engine_id, entry)
        except EngineUnavailable as error:
            return ModelStatus(engine_id, entry.id, kind, "missing", None, size, (str(error),))
        assert folder is not None
        if not folder.is_dir():
            return ModelStatus(engine_id, entry.id, kind, "missing", folder, size)
        problems = tuple(p for f in files if (p := check_file(folder / f.path, f, verify)))
        state: State = "corrupt" if problems else "installed"
        return ModelStatus(engine_id, entry.id, kind, state, folder, size, problems)

    @staticmethod
    def local(engine_id: str, entry: ModelEntry, folder: Path) -> ModelStatus:
        """``entry`` read from a folder of the user's (``engines.<id>.model_dir``): installed when
        the folder holds every one of the entry's ``required_files``; sha256s are not checked,
        since a fine-tuned copy differs from the declared files."""
        if not folder.is_dir():
            problem = f"{folder} is not a folder (the setting engines.{engine_id}.model_dir)"
            return ModelStatus(engine_id, entry.id, "local", "missing", folder, 0, (problem,))
        missing = [name for name in entry.required_files if not (folder / name).is_file()]
        if missing:
            problem = f"{folder} lacks {', '.join(missing)} (engines.{engine_id}.model_dir)"
            return ModelStatus(engine_id, entry.id, "local", "missing", folder, 0, (problem,))
        size = sum((folder / name).stat().st_size for name in entry.required_files)
        return ModelStatus(engine_id, entry.id, "local", "installed", folder, size)

    def require(self, engine_id: str, entry: ModelEntry, local: Path | None = None) -> Path | None:
        """The model's folder for loading; ModelNotInstalled (naming the command that installs
        it) when its files are missing or their sizes are wrong. A package or folder that
        declares no files is handed on unchecked (EngineUnavailable: its package is missing).
        ``local``: the folder of the setting ``engines.<id>.model_dir``, checked instead."""
        if local is not None:
            status = self.local(engine_id, entry, local)
            if status.state != "installed":
                raise _not_installed(status)
            return local
        source = entry.source
        if isinstance(source, PackageSource | FolderSource) and not source.files:
            return self.folder(engine_id, entry)  # nothing declared to check: as before sources
        status = self.status(engine_id, entry)
        if status.state != "installed":
            raise _not_installed(status)
        return status.folder

    def pull(
        self, engine_id: str, entry: ModelEntry, progress: Progress | None = None
    ) -> ModelStatus:
        """Fetch, verify and install the model (a whole, verified copy stays as it is)."""
        source = entry.source
        fail = Fail(engine_id, entry.id, pull_command(engine_id, entry.id))
        status = self.status(engine_id, entry, verify=True)
        if status.state == "installed":
            return status
        if not isinstance(source, HubSource | UrlSource):
            raise _not_installed(status)
        final = self.cache / engine_id / entry.id
        staging = final.with_name(f".{entry.id}.partial")
        final.parent.mkdir(parents=True, exist_ok=True)
        with _locked(final.with_name(f".{entry.id}.lock")):
            status = self.status(engine_id, entry, verify=True)
            if status.state == "installed":  # another pull installed it while this one waited
                return status
            if final.exists() and not staging.exists():
                os.replace(final, staging)  # a damaged copy: keep its good files, refetch the rest
            elif final.exists():
                shutil.rmtree(final)
            staging.mkdir(exist_ok=True)
            total = sum(f.size for f in source.files)
            done = 0
            for file in source.files:
                target = staging / file.path
                if check_file(target, file, digest=True) is None:
                    done += file.size
                    _tell(progress, file.path, done, total)
                    continue
                if target.exists() and target.stat().st_size >= file.size:
                    target.unlink()  # whole but wrong (or too long): nothing to resume from
                base = done

                def advance(count: int, path: str = file.path) -> None:
                    nonlocal done
                    done += count
                    _tell(progress, path, done, total)

                self._fetch(source, file, target, advance, fail)
                if (problem := check_file(target, file, digest=True)) is not None:
                    target.unlink()  # never resumed from: start this file afresh next time
                    raise fail(problem, "verification_failed")
                done = base + file.size
            os.replace(staging, final)
        return self.status(engine_id, entry)

    def remove(self, engine_id: str, entry: ModelEntry) -> bool:
        """Delete a pulled model and any unfinished pull of it; False when there was none."""
        if not isinstance(entry.source, HubSource | UrlSource):
            raise ModelNotInstalled(
                f"model {entry.id!r} of engine {engine_id!r} is not in the model cache "
                f"(its files come from its {_kind(entry.source)}); nothing to remove",
                {"engine": engine_id, "model": entry.id, "reason": "not_pulled"},
            )
        final = self.cache / engine_id / entry.id
        found = False
        for folder in (final, final.with_name(f".{entry.id}.partial")):
            if folder.exists():
                shutil.rmtree(folder)
                found = True
        return found

    @staticmethod
    def _fetch(
        source: HubSource | UrlSource,
        file: ModelFile,
        target: Path,
        advance: Callable[[int], None],
        fail: Fail,
    ) -> None:
        if isinstance(source, HubSource):
            from_hub(source, file, target, fail)
            advance(file.size)
            return
        assert file.url is not None  # UrlSource checks that every file has one
        resumed = target.exists() and 0 < target.stat().st_size < file.size
        download(file.url, target, file, advance, fail)
        if resumed and check_file(target, file, digest=True) is not None:
            target.unlink()  # the bytes kept from before were not the file's: fetch it whole
            download(file.url, target, file, advance, fail)


def _not_installed(status: ModelStatus) -> ModelNotInstalled:
    engine_id, model_id = status.engine, status.model
    if status.pullable:
        fix = f"install it with: {pull_command(engine_id, model_id)}"
    elif status.source == "package":
        fix = "reinstall the package that provides it"
    elif status.source == "local":
        fix = f"point engines.{engine_id}.model_dir at a folder that holds the model's files"
    else:
        fix = f"put its files in {status.folder}"
    why = "; ".join(status.problems) or "its files are missing"
    return ModelNotInstalled(
        f"model {model_id!r} of engine {engine_id!r} is not installed ({why}); {fix}",
        {
            "engine": engine_id,
            "model": model_id,
            "reason": status.state,
            "command": pull_command(engine_id, model_id) if status.pullable else None,
            "folder": None if status.folder is None else str(status.folder),
        },
    )


def _tell(progress: Progress | None, path: str, done: int, total: int) -> None:
    if progress is not None:
        progress(path, done, total)


def _kind(source: object) -> str:
    kinds = {PackageSource: "package", FolderSource: "folder", HubSource: "hub", UrlSource: "url"}
    return kinds.get(type(source), "none")


def _package_folder(source: PackageSource, entry: ModelEntry, engine_id: str) -> Path:
    package, _, relative = source.resource.partition(":")
    spec = importlib.util.find_spec(package)
    if spec is None:
        raise EngineUnavailable(
            f"model {entry.id!r} of {engine_id!r} lives in package {package!r}"
            ", which is not installed",
            {"engine": engine_id},
        )
    if spec.submodule_search_locations:
        base = Path(next(iter(spec.submodule_search_locations)))
    else:
        base = Path(str(spec.origin)).parent
    return base / relative


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One pull of a model at a time, across processes (an OS lock: freed when a process dies)."""
    with path.open("a") as handle:
        try:
            import fcntl
        except ImportError:  # Windows: no lock
            yield
            return
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
