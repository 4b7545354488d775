"""Who changed process state: the module being imported, or the line of the engine's code.

The fresh process (``mizuoto_contract.isolated``) finds which state an engine's import and load
changed; a watch running through them also finds who. It compares the state before and after
every module's execution (a finder first on ``sys.meta_path`` wraps each loader's
``exec_module``), so a change is charged to the innermost module being imported, named with the
modules that imported it: an engine whose import of librosa pulls in a library that sets an
environment variable learns which library. The packages the host itself imports (the engine's
plugin and implementation; not the standard library, nor torch or the host, which the process held
before) are the engine's: from the first ``take`` after their import on, the watch also traces
their functions (``sys.settrace``), so a change made outside any import, in the engine's load, is
charged to the line that made it.

Two readings keep it cheap. ``quick`` (the RNGs, the environment: what changes most, in
microseconds) is compared at every line; ``full`` (loggers, signals, torch's switches too) around
each module's execution and each call the host makes into the engine's code, and a change only it
sees is charged to that module or that call, not to a line. Tracing slows the engine's load (about
twice, for Python code): stop the watch before the calls.

    watch = Watch.start(quick, full)    # snapshot.watch_culprits() starts one
    ...                                 # import the engine
    watch.take()                        # entry name -> who changed it since the previous take
    ...                                 # load it
    watch.take()
    watch.stop()
"""

from __future__ import annotations

import atexit
import contextlib
import inspect
import os
import sys
import threading
from collections.abc import Callable, Mapping
from types import CodeType, FrameType, ModuleType
from typing import Any

import attrs

Reader = Callable[[], Mapping[str, object]]
_ENVIRON = "os.environ"  # the quick reading's key for every os.environ[...] entry
_NAMED = 3  # culprits named per entry; more are counted
_FUNCTION = inspect.CO_OPTIMIZED  # a function's code (not a module's or a class's body)
_RUNNING: list[Watch] = []  # the watch this process runs, if any: imports and tracing are global


def take() -> dict[str, str]:
    """What the running watch charged since the previous take; {} when none runs."""
    return _RUNNING[0].take() if _RUNNING else {}


@attrs.frozen
class _Line:
    code: CodeType
    line: int
    module: str

    def __str__(self) -> str:
        return f"at {_short(self.code.co_filename)}:{self.line}"

    def exact(self) -> str:
        """Where, and in which function (module-level code has none)."""
        function = "" if self.code.co_name == "<module>" else f" in {_qualname(self.code)}"
        return f"{self}{function}"


class Watch:
    """Charges each change of the readings to the import or the line that made it."""

    def __init__(self, quick: Reader, full: Reader) -> None:
        self._read_quick, self._read_full = quick, full
        self._quick, self._full = quick(), full()
        self._found: dict[str, list[str]] = {}
        self._held = {name.partition(".")[0] for name in sys.modules}
        self._traced: set[str] = set()  # top-level packages whose code runs line by line
        self._thread = threading.get_ident()  # the one sys.settrace traces
        self._at: _Line | None = None  # the engine's line running now (on that thread)
        self._local = threading.local()  # .stack: the modules being imported on each thread
        self._lock = threading.RLock()
        self._finder = _Finder(self)

    @classmethod
    def start(cls, quick: Reader, full: Reader) -> Watch:
        if _RUNNING:
            raise RuntimeError("a culprit watch runs already: stop it first")
        watch = cls(quick, full)
        sys.meta_path.insert(0, watch._finder)
        _RUNNING.append(watch)
        atexit.register(watch.stop)  # no tracing while the interpreter tears modules down
        return watch

    def stop(self) -> None:
        atexit.unregister(self.stop)
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self._finder)
        if sys.gettrace() == self._call:
            sys.settrace(None)
        with contextlib.suppress(ValueError):
            _RUNNING.remove(self)

    def take(self) -> dict[str, str]:
        """Entry name -> who changed it since the previous take, culprits in order.

        The first take after the engine's packages were imported starts tracing their lines:
        what their import did is charged by module already, and tracing every call of the
        host's discovery would cost more than the import itself.
        """
        self._look(full=True)
        with self._lock:
            found, self._found = self._found, {}
        if self._traced and threading.get_ident() == self._thread and sys.gettrace() is None:
            sys.settrace(self._call)  # never over a debugger's or coverage's tracer
        return {name: _join(culprits) for name, culprits in found.items()}

    # Imports: called by _Loader around each module's execution.

    def entering(self, name: str) -> None:
        stack = self._stack()
        top = name.partition(".")[0]
        # Imported by nobody's module: by the host, for the engine (its plugin, its class).
        if not stack and top not in self._held and top not in sys.stdlib_module_names:
            self._traced.add(top)
        self._look(full=True)  # what the importer did before this import
        stack.append(name)

    def leaving(self) -> None:
        self._look(full=True)  # what this module's execution did
        self._stack().pop()

    # Lines: sys.settrace's functions, on the thread that started the watch.

    def _call(self, frame: FrameType, event: str, arg: object) -> Callable[..., Any] | None:
        # Functions only: what a module's or a class's body does is charged to its import.
        if not frame.f_code.co_flags & _FUNCTION:
            return None
        if frame.f_globals.get("__name__", "").partition(".")[0] not in self._traced:
            return None
        # What the caller's line did before this call; all of it when the host calls in.
        self._look(full=self._at is None)
        return self._step

    def _step(self, frame: FrameType, event: str, arg: object) -> Callable[..., Any]:
        if event == "line":
            self._look(full=False)  # what the previous line did
            self._at = _Line(frame.f_code, frame.f_lineno, frame.f_globals.get("__name__", ""))
        elif event == "return":
            caller = self._nearest(frame.f_back)
            if caller is None:  # back to the host: what the last line and the call did
                self._look(full=True, within=frame.f_code)
            else:
                self._look(full=False)  # what the last line did
            self._at = caller
        return self._step

    def _nearest(self, frame: FrameType | None) -> _Line | None:
        """The innermost line of the engine's code still running, below the host's frames."""
        while frame is not None:
            module = frame.f_globals.get("__name__", "")
            if module.partition(".")[0] in self._traced:
                return _Line(frame.f_code, frame.f_lineno, module)
            frame = frame.f_back
        return None

    # Comparing and charging.

    def _look(self, full: bool, within: CodeType | None = None) -> None:
        """Compare the quick reading (and, ``full``, the other one) with the previous, charging
        each change to where we are: a change only the other reading sees, to the modules being
        imported, or to the host's call ``within`` which it happened."""
        if getattr(self._local, "looking", False):  # a reading that imports: not the engine's
            return
        self._local.looking = True
        try:
            with self._lock:
                quick = self._read_quick()
                if quick != self._quick:
                    for name in _moved(self._quick, quick):
                        self._charge(name, self._culprit(exact=True))
                    self._quick = quick
                if full:
                    entries = self._read_full()
                    if entries != self._full:
                        for name in _moved(self._full, entries):
                            if name.partition("[")[0] not in quick:
                                self._charge(name, self._culprit(exact=False, within=within))
                        self._full = entries
        finally:
            self._local.looking = False

    def _charge(self, name: str, culprit: str | None) -> None:
        charged = self._found.setdefault(name, [])
        if culprit is not None and culprit not in charged:
            charged.append(culprit)

    def _culprit(self, exact: bool, within: CodeType | None = None) -> str | None:
        """Where we are: the modules being imported and, for a change the quick reading saw
        (``exact``: at the line it follows), the line of the engine's code."""
        stack = self._stack()
        at = self._at if threading.get_ident() == self._thread else None
        innermost = stack[-1] if stack else None
        said: list[str] = []
        if exact and at is not None and at.module == (innermost or at.module):
            said.append(at.exact())
        elif within is not None and innermost is None:
            said.append(f"in the call of {_qualname(within)} ({_short(within.co_filename)})")
        if innermost is not None:
            importers = [
                f"{name} {at}" if at is not None and at.module == name else name
                for name in reversed(stack[:-1])
            ]
            if len(importers) > 3:  # the nearest importers and the one at the top
                importers = [*importers[:2], "...", importers[-1]]
            chain = f" (imported by {', by '.join(importers)})" if importers else ""
            said.append(f"during the import of {innermost}{chain}")
        return ", ".join(said) or None

    def _stack(self) -> list[str]:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        return stack


class _Finder:
    """First on sys.meta_path: asks the finders behind it and wraps the loader they give."""

    def __init__(self, watch: Watch) -> None:
        self._watch = watch

    def find_spec(self, name: str, path: Any, target: ModuleType | None = None) -> Any:
        finders = sys.meta_path
        behind = finders[finders.index(self) + 1 :] if self in finders else []
        for finder in behind:
            find = getattr(finder, "find_spec", None)
            spec = None if find is None else find(name, path, target)
            if spec is None:
                continue
            if hasattr(spec.loader, "exec_module") and not isinstance(spec.loader, _Loader):
                spec.loader = _Loader(spec.loader, self._watch)
            return spec
        return None


class _Loader:
    """A module's own loader, executing it between two looks of the watch; afterwards the module
    holds its own loader again."""

    def __init__(self, loader: Any, watch: Watch) -> None:
        self._loader = loader
        self._watch = watch

    def create_module(self, spec: Any) -> ModuleType | None:
        create = getattr(self._loader, "create_module", None)
        return None if create is None else create(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._watch.entering(module.__name__)
        try:
            self._loader.exec_module(module)
        finally:
            self._watch.leaving()
            spec = getattr(module, "__spec__", None)
            if spec is not None and spec.loader is self:
                spec.loader = self._loader
            if getattr(module, "__loader__", None) is self:
                # a module may refuse the assignment (torch._dynamo.config's attribute guard)
                with contextlib.suppress(AttributeError):
                    module.__loader__ = self._loader

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, get_data, is_package, ...
        return getattr(self._loader, name)


def _moved(before: Mapping[str, object], after: Mapping[str, object]) -> list[str]:
    """The names whose values differ; a mapping value stands for one entry per key,
    ``name[key]`` (the environment's variables)."""
    moved: list[str] = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if isinstance(old, Mapping) or isinstance(new, Mapping):
            was = old if isinstance(old, Mapping) else {}
            now = new if isinstance(new, Mapping) else {}
            keys = {k for k in set(was) | set(now) if was.get(k) != now.get(k)}
            moved.extend(f"{name}[{_text(key)}]" for key in sorted(keys, key=_text))
        else:
            moved.append(name)
    return moved


def _text(key: object) -> str:
    return os.fsdecode(key) if isinstance(key, bytes) else str(key)


def _join(culprits: list[str]) -> str:
    named = ", then ".join(culprits[:_NAMED])
    more = len(culprits) - _NAMED
    return f"{named}, and {more} more" if more > 0 else named


def _short(filename: str) -> str:
    """``filename`` from the folder on sys.path that holds it (``package/module.py``)."""
    roots = sorted((p.rstrip("/") + "/" for p in sys.path if p), key=len, reverse=True)
    for root in roots:
        if filename.startswith(root):
            return filename[len(root) :]
    return filename


def _qualname(code: CodeType) -> str:
    return getattr(code, "co_qualname", code.co_name)  # Python 3.11 on
