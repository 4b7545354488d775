"""The engine's whole life in a fresh process, measured against a baseline taken before any of
its code was imported.

In the process that runs the checks, earlier checks have already imported and loaded the engine,
so a change it makes the same way every time (an environment variable, the working directory, a
global seed drawn at load) is in place before any later "before" snapshot. Here the baseline comes
first; then the engine is imported, loaded, called twice, closed early, cancelled and unloaded,
with process state, child processes (grandchildren too: the child is a subreaper on Linux), open
sockets and the files in its temporary folder, working folder and HOME (empty folders of its own)
read after each phase; after unload, the threads and torch tensors that were not there before the
import and the load. The child also has a hash seed of its own, and reports the digest of its
seeded audio for determinism.fresh_process. One run serves every check that reads it; it starts
when the first of them runs (they run last).

    python -m mizuoto_contract.isolated ENGINE DEVICE TEXT [FOLDER]   (prints one JSON line)

FOLDER holds the run's own ``tmp``, ``work`` and ``home`` folders (``start`` makes them).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from mizuoto_contract import zygote
from mizuoto_contract.interrupt import interrupt_host
from mizuoto_contract.outcome import Fail
from mizuoto_contract.subject import SEED, child_environment, child_result, digest, subject_for

if TYPE_CHECKING:
    from mizuoto_contract.subject import Subject

PHASES = ("import", "load", "call", "second call", "early close", "cancel", "unload")
_TIMEOUT_SECONDS = 600.0
_PR_SET_CHILD_SUBREAPER = 36  # linux/prctl.h
_THREAD_GRACE_SECONDS = 0.5  # for threads still ending after unload, all of them together
_MAX_LISTED = 5_000  # entries listed per folder: an engine's big cache still lists quickly
_HOLDER_SEARCHES = 40  # gc.get_referrers calls spent naming what holds a leaked tensor
# The run's own folders: what an engine writes there and leaves is a leak. Each is listed
# under its label; the working folder and HOME are the run's own only when FOLDER is given.
_FOLDERS = {"tmp": "the temporary folder", "work": "the working folder", "home": "HOME"}
# Where platformdirs and friends write under HOME, set or not: into the run's own HOME too.
_XDG = {
    "XDG_CACHE_HOME": ".cache",
    "XDG_CONFIG_HOME": ".config",
    "XDG_DATA_HOME": ".local/share",
    "XDG_STATE_HOME": ".local/state",
}


def prepare(subject: Subject) -> None:
    """Get ready for an isolated run without computing anything yet: on Linux, start the fork
    server, which imports torch. The run itself waits for the checks that read it, which run
    last: two processes computing with torch at once on few cores slow each other down many
    times over (their thread pools spin against each other)."""
    # The environment, folder and import path the child starts from, as they are before any
    # check runs: an engine that changes one in this process would otherwise hand its change to
    # the child, where making it again changes nothing.
    start = subject.shared.setdefault(
        "isolated_start", (dict(os.environ), os.getcwd(), list(sys.path))
    )
    if zygote.available():
        zygote.warm(child_environment(), start[1])


def start(subject: Subject) -> None:
    """Start the isolated run in the background (once per subject)."""
    if "isolated" in subject.shared or "isolated_report" in subject.shared:
        return
    folder = Path(tempfile.mkdtemp(prefix="mizuoto-contract-"))
    for name in _FOLDERS:
        (folder / name).mkdir()
    temp, home = str(folder / "tmp"), folder / "home"
    base, cwd, path = subject.shared.get(
        "isolated_start", (dict(os.environ), os.getcwd(), list(sys.path))
    )
    environment = {
        **base,
        **_weight_stores(base),
        "TMPDIR": temp,
        "TEMP": temp,
        "TMP": temp,
        "HOME": str(home),
        **{name: str(home / where) for name, where in _XDG.items()},
        "MIZUOTO_PLUGINS": subject.record.distribution,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
    }
    argv = [subject.engine_id, subject.device, subject.text, str(folder)]
    if zygote.available():
        child: Any = zygote.fork(argv, child_environment(environment, base), folder, cwd, path)
    else:
        child = subject.in_child(
            ["-m", "mizuoto_contract.isolated", *argv], environment, folder, base=base, cwd=cwd
        )
    subject.shared["isolated"] = (child, folder)


def _weight_stores(base: Mapping[str, str]) -> dict[str, str]:
    """The folders engines read models from, pinned where they are: under the child's own HOME
    their defaults would be empty (what an engine downloads there is a cache, not a leak)."""
    from mizuoto_sdk.host.models import HOME_VARIABLE, data_home

    home = base.get("HOME") or os.path.expanduser("~")
    cache = base.get("XDG_CACHE_HOME") or os.path.join(home, ".cache")
    stores = {
        HOME_VARIABLE: str(data_home()),
        "HF_HOME": os.path.join(cache, "huggingface"),
        "TORCH_HOME": os.path.join(cache, "torch"),
    }
    return {name: value for name, value in stores.items() if name not in base}


def report(subject: Subject) -> dict[str, Any]:
    """The isolated run's report, waiting for it if needed (starting it if nobody did)."""

    start(subject)
    cached = subject.shared.get("isolated_report")
    if isinstance(cached, Fail):  # one failed run is every reader's failure
        raise cached
    if cached is None:
        child, folder = subject.shared["isolated"]
        try:
            cached = child_result(
                child, "the engine's life to run in a fresh process", _TIMEOUT_SECONDS
            )
        except Fail as failure:
            subject.shared["isolated_report"] = failure
            raise
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        subject.shared["isolated_report"] = cached
    return cached


def stop(subject: Subject) -> None:
    """End an isolated run nobody read (a run cut short) and remove its folder."""
    started = subject.shared.pop("isolated", None)
    if started is None or "isolated_report" in subject.shared:
        return
    child, folder = started
    if child.poll() is None:
        child.kill()
    child.wait()
    shutil.rmtree(folder, ignore_errors=True)


def _become_subreaper() -> None:
    """Adopt the engine's orphans (Linux): a grandchild whose parent exited (a daemonised
    helper, ``sh -c 'helper &'``) stays this process's child, to be listed and ended."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _end_leftovers(before: dict[int, str]) -> None:
    """Kill and reap the child processes the engine left (they are reported already), by pid,
    so that none outlives the run; again for the orphans each kill hands to this subreaper."""
    for _ in range(8):
        left = [pid for pid in child_processes() if pid not in before]
        if not left:
            return
        for pid in left:
            with contextlib.suppress(OSError):
                os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
        for pid in left:
            with contextlib.suppress(OSError):
                os.waitpid(pid, 0)


def child_processes(exclude: frozenset[int] = frozenset()) -> dict[int, str]:
    """This process's child processes (zombies too): pid -> ``state command``."""
    me, found = os.getpid(), {}
    if os.path.isdir("/proc/self"):
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    line = stat.read()
            except OSError:
                continue
            name, _, rest = line.rpartition(")")
            fields = rest.split()
            if len(fields) > 1 and int(fields[1]) == me:
                found[int(entry)] = f"{fields[0]} {name.partition('(')[2]}"
    else:
        listing = subprocess.Popen(
            ["ps", "-A", "-o", "pid=,ppid=,stat=,comm="], stdout=subprocess.PIPE, text=True
        )
        out, _ = listing.communicate()
        for row in out.splitlines():
            parts = row.split(None, 3)
            if len(parts) == 4 and int(parts[1]) == me and int(parts[0]) != listing.pid:
                found[int(parts[0])] = f"{parts[2]} {parts[3]}"
    return {pid: what for pid, what in found.items() if pid not in exclude}


@attrs.frozen
class _Held:
    """What the process holds beyond a phase: child processes, the files in its own folders
    (label -> relative paths) and its open sockets (``socket:[inode]``)."""

    processes: dict[int, str]
    files: frozenset[tuple[str, str]]
    sockets: frozenset[str]

    @classmethod
    def now(cls, folders: Mapping[str, str]) -> _Held:
        listed = {(label, path) for label, root in folders.items() for path in _listing(root)}
        return cls(child_processes(), frozenset(listed), frozenset(_sockets()))

    def added(self, before: _Held, folders: Mapping[str, str]) -> dict[str, list[str]]:
        """What this holds and ``before`` did not, described, by report key."""
        processes = {p: w for p, w in self.processes.items() if p not in before.processes}
        new = self.files - before.files
        # A new folder goes without saying when something new lies in it.
        parents = {(label, os.path.dirname(path)) for label, path in new}
        files = sorted(new - parents)
        return {
            "processes": [f"pid {p} ({_process_name(w)})" for p, w in sorted(processes.items())],
            "files": [_file_name(label, path, folders) for label, path in files],
            "sockets": _socket_names(self.sockets - before.sockets),
        }


def _process_name(state_command: str) -> str:
    state, _, command = state_command.partition(" ")
    return f"{command}, ended but never waited for" if state.startswith("Z") else command


def _listing(root: str) -> list[str]:
    """Every file and folder under ``root``, relative to it (at most ``_MAX_LISTED``)."""
    found: list[str] = []
    for folder, names, files in os.walk(root):
        relative = os.path.relpath(folder, root)
        for name in [*names, *files]:
            found.append(os.path.normpath(os.path.join(relative, name)))
        if len(found) >= _MAX_LISTED:
            break
    return found


def _file_name(label: str, path: str, folders: Mapping[str, str]) -> str:
    if label == "tmp":
        return os.path.join(folders[label], path)
    if label == "home":
        return f"~/{path} (HOME)"
    return f"{path} ({_FOLDERS[label]})"


def _sockets() -> set[str]:
    """This process's open sockets (Linux: the ``socket:[inode]`` links in /proc/self/fd)."""
    found = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir("/proc/self/fd"):
            with contextlib.suppress(OSError):
                link = os.readlink(f"/proc/self/fd/{fd}")
                if link.startswith("socket:"):
                    found.add(link)
    return found


def _socket_names(links: set[str] | frozenset[str]) -> list[str]:
    """Each socket with its protocol and addresses, where /proc/self/net lists it."""
    if not links:
        return []
    inodes = {link.removeprefix("socket:[").rstrip("]"): link for link in links}
    names = {link: link for link in links}
    for protocol in ("tcp", "tcp6", "udp", "udp6"):
        with contextlib.suppress(OSError):
            rows = Path(f"/proc/self/net/{protocol}").read_text().splitlines()[1:]
            for fields in (row.split() for row in rows):
                if len(fields) > 9 and fields[9] in inodes:
                    local, remote = _address(fields[1]), _address(fields[2])
                    if protocol.startswith("tcp") and fields[3] == "0A":
                        what = f"listening on {local}"
                    elif remote.rpartition(":")[2] == "0":  # not connected
                        what = f"bound to {local}"
                    else:
                        what = f"{local} to {remote}"
                    names[inodes[fields[9]]] = f"{protocol} socket {what}"
    with contextlib.suppress(OSError):
        for fields in (r.split() for r in Path("/proc/self/net/unix").read_text().splitlines()):
            if len(fields) > 6 and fields[6] in inodes:
                where = f" at {fields[7]}" if len(fields) > 7 else ""
                names[inodes[fields[6]]] = f"unix socket{where}"
    return sorted(f"{name} ({link})" if name != link else link for link, name in names.items())


def _address(field: str) -> str:
    """``0100007F:1F90`` (/proc/net's hex, 32-bit words in the host's byte order) ->
    ``127.0.0.1:8080``."""
    host, _, port = field.partition(":")
    raw = bytes.fromhex(host)
    if sys.byteorder == "little":
        raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return f"{socket.inet_ntop(family, raw)}:{int(port, 16)}"


def _hosts(thread: threading.Thread) -> bool:
    """Whether ``thread`` is the host's or the runtime's own, alive for the process by design
    (the child-process spawner of ``ctx.open_process``), not the engine's."""
    target = getattr(thread, "_target", None)
    module = getattr(getattr(target, "__func__", target), "__module__", None) or ""
    return module.partition(".")[0] in ("mizuoto_runtime", "mizuoto_sdk")


def _threads_left(before: set[threading.Thread], started: dict[threading.Thread, str]) -> list[str]:
    """The threads running now that were not before the engine's import, with the phase
    after which each was first seen; those ending within a short grace are not left."""
    deadline = time.monotonic() + _THREAD_GRACE_SECONDS
    left = [t for t in threading.enumerate() if t not in before and not _hosts(t)]
    for thread in left:
        with contextlib.suppress(RuntimeError, AssertionError):  # a foreign thread's stand-in
            thread.join(timeout=max(deadline - time.monotonic(), 0.0))
    return [
        f"thread {t.name!r} (running since the {started.get(t, 'unload')})"
        for t in left
        if t.is_alive()
    ]


def _storages() -> dict[tuple[str, int], Any]:
    """A live torch tensor per storage (device, address), from a walk of the collector's
    objects; none where torch was never imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {}
    found: dict[tuple[str, int], Any] = {}
    for value in gc.get_objects():
        # type(), not isinstance: isinstance reads __class__, which a deprecated proxy warns on
        if issubclass(type(value), torch.Tensor):
            with contextlib.suppress(Exception):  # a sparse or fake tensor has no storage
                storage = value.untyped_storage()
                if storage.nbytes() and storage.device.type != "meta":
                    found.setdefault((str(storage.device), storage.data_ptr()), value)
    return found


def _memory_left(before: set[tuple[str, int]]) -> list[str]:
    """The tensor storages alive now that were not before the load: their bytes, and the
    module global or class attribute holding the largest."""
    leaked = {key: tensor for key, tensor in _storages().items() if key not in before}
    if leaked:  # collected again first: a thread that ended just now can leave cycles
        leaked.clear()
        gc.collect()
        leaked = {key: tensor for key, tensor in _storages().items() if key not in before}
    if not leaked:
        return []
    sizes = {key: tensor.untyped_storage().nbytes() for key, tensor in leaked.items()}
    largest = leaked[max(sizes, key=sizes.__getitem__)]
    holder = _holder(largest, ignore=(leaked, sizes))
    shape = "x".join(map(str, largest.shape)) or "scalar"
    return [
        f"{sum(sizes.values())} bytes in {len(leaked)} tensor storage(s) not freed; the largest, "
        f"{str(largest.dtype).removeprefix('torch.')} {shape} on {largest.device}, is held by "
        + (
            holder
            or "no module global or class attribute found nearby (gc.get_referrers shows whom)"
        )
    ]


def _holder(target: object, ignore: tuple[object, ...]) -> str | None:
    """The module global or class attribute through which ``target`` is still reachable
    (``package.module.NAME``, ``package.module.Class.name``), searching its referrers nearest
    first; None when ``_HOLDER_SEARCHES`` searches find none."""
    modules = {
        id(vars(m)): name
        for name, m in list(sys.modules.items())
        if isinstance(m, types.ModuleType)
    }
    frontier: list[tuple[object, object]] = [(target, target)]
    seen = {id(target), id(frontier), id(frontier[0]), *map(id, ignore)}
    for _ in range(_HOLDER_SEARCHES):
        if not frontier:
            return None
        value, child = frontier.pop(0)
        for ref in gc.get_referrers(value):
            if id(ref) in seen or isinstance(ref, types.FrameType):
                continue
            seen.add(id(ref))
            if id(ref) in modules:
                return f"{modules[id(ref)]}.{_key(ref, value)}"
            if isinstance(ref, type):  # through the class's own dict (value), or directly
                name = _key(vars(ref), child) or _key(vars(ref), value)
                return f"{ref.__module__}.{ref.__qualname__}" + (f".{name}" if name else "")
            step = (ref, value)
            seen.add(id(step))
            frontier.append(step)
    return None


def _key(mapping: Mapping[str, object], value: object) -> str | None:
    return next((str(k) for k, v in mapping.items() if v is value), None)


def _main(engine_id: str, device: str, text: str, folder: str | None = None) -> dict[str, Any]:
    import numpy  # noqa: F401 - imported before the baseline, so that importing is no change

    with contextlib.suppress(ImportError):  # where torch is not installed, torch-free engines
        import torch  # noqa: F401

    import mizuoto_runtime.runtime  # noqa: F401
    from mizuoto_contract.snapshot import snapshot, watch_culprits
    from mizuoto_sdk.host import Discovery

    folders = {"tmp": tempfile.gettempdir()}
    if folder is not None:  # the run's own folders: work in one, and list them all
        folders = {name: os.path.join(folder, name) for name in _FOLDERS}
        sys.path[:] = [os.path.abspath(entry) for entry in sys.path]  # "" was the old folder
        os.chdir(folders["work"])
    baseline = snapshot()
    watch = watch_culprits()  # names who changes state at import and load (Change.culprit)
    held0, threads0 = _Held.now(folders), set(threading.enumerate())
    started: dict[threading.Thread, str] = {}
    keys = ("state", "processes", "files", "sockets", "threads", "memory")
    out: dict[str, Any] = {key: {} for key in keys}
    state: dict[str, Any] = {"previous": baseline}

    def measure(phase: str, held: _Held) -> None:
        now = snapshot()
        # Changed in this phase and not back to the baseline (a load's change that unload
        # undoes is the load's, not the unload's).
        moved = {c.name for c in baseline.diff(now)}
        changes = [c for c in state["previous"].diff(now) if c.name in moved]
        if changes:
            out["state"][phase] = [str(c) for c in changes]
        state["previous"] = now
        for key, found in _Held.now(folders).added(held, folders).items():
            if found:
                out[key][phase] = found
        for thread in threading.enumerate():
            if thread not in threads0:
                started.setdefault(thread, phase)

    def run(phase: str, body: Callable[[], object], held: _Held | None = None) -> bool:
        try:
            body()
        except Exception as error:
            from mizuoto_contract.trace import engine_frame

            where = engine_frame(error, names["subject"].sources()) if "subject" in names else None
            from mizuoto_contract.trace import short_traceback

            message = f"{type(error).__name__}: {error}"
            out["error"] = {"phase": phase, "message": message, "where": where}
            out["error"]["traceback"] = short_traceback(error, limit=6)
            return False
        measure(phase, held0 if held is None else held)
        return True

    names: dict[str, Any] = {}

    def imported() -> None:
        names["subject"] = subject_for(engine_id, device, Discovery())
        names["subject"].text = text
        names["subject"].discovery.get_engine(engine_id)

    if not run("import", imported):
        return out
    subject = names["subject"]
    tensors0 = set(_storages())  # an engine's module-level tensors made at import stay

    def loaded() -> None:
        names["service"] = subject.service()
        names["handle"] = subject.load(names["service"])

    loaded_well = run("load", loaded)
    watch.stop()  # tracing would slow the calls down
    if not loaded_well:
        return out
    if subject.capability is not None:

        def call() -> None:
            out["digest"] = digest(subject.audio(names["handle"], SEED, subject.sentence))

        if not run("call", call):
            return out
        after_call = _Held.now(folders)
        steps: list[tuple[str, Callable[[], object]]] = [
            ("second call", lambda: subject.audio(names["handle"], SEED, subject.sentence)),
            ("early close", lambda: subject.close_early(names["handle"])),
            (
                "cancel",
                lambda: out.__setitem__("cancel", interrupt_host(subject, names["handle"]).outcome),
            ),
        ]
        for phase, body in steps:
            if not run(phase, body, after_call):
                return out

    def unloaded() -> None:
        names["service"].unload()
        # And the host ends, as a server's does: what stays is held by a module, a class or a
        # thread (an Engine instance's own attributes go with its host).
        subject.release()
        del names["handle"], names["service"]
        gc.collect()

    if run("unload", unloaded):
        for key, found in (
            ("threads", _threads_left(threads0, started)),
            ("memory", _memory_left(tensors0)),
        ):
            if found:
                out[key]["unload"] = found
    return out


def main(argv: list[str]) -> None:
    """Run ``ENGINE DEVICE TEXT [FOLDER]`` and print the report as one JSON line."""
    _become_subreaper()
    try:
        print(json.dumps(_main(*argv[:4])), flush=True)
    finally:
        _end_leftovers({})


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable(all_threads=True)  # a crash leaves every thread's stack in stderr
    main(sys.argv[1:])
