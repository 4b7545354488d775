"""The engine's whole life in a fresh process, measured against a baseline taken before any of
its code was imported.

In the process that runs the checks, earlier checks have already imported and loaded the engine,
so a change it makes the same way every time (an environment variable, the working directory, a
global seed drawn at load) is in place before any later "before" snapshot. Here the baseline comes
first; then the engine is imported, loaded, called twice, closed early, cancelled and unloaded,
with process state, child processes and temporary files read after each phase. The child also
has a hash seed and a temporary folder of its own, and reports the digest of its seeded audio for
determinism.fresh_process. One run serves every check that reads it; it starts when the first of
them runs (they run last).

    python -m mizuoto_contract.isolated ENGINE DEVICE TEXT   (prints one JSON line)
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mizuoto_contract import zygote
from mizuoto_contract.interrupt import interrupt_host
from mizuoto_contract.subject import SEED, child_environment, child_result, digest, subject_for

if TYPE_CHECKING:
    from mizuoto_contract.subject import Subject

PHASES = ("import", "load", "call", "second call", "early close", "cancel", "unload")
_TIMEOUT_SECONDS = 600.0


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
    temp = folder / "tmp"
    temp.mkdir()
    environment = {
        "TMPDIR": str(temp),
        "TEMP": str(temp),
        "TMP": str(temp),
        "MIZUOTO_PLUGINS": subject.record.distribution,
    }
    base, cwd, path = subject.shared.get(
        "isolated_start", (dict(os.environ), os.getcwd(), list(sys.path))
    )
    environment = {**base, **environment, "PYTHONPATH": os.pathsep.join(p for p in path if p)}
    argv = [subject.engine_id, subject.device, subject.text]
    if zygote.available():
        child: Any = zygote.fork(argv, child_environment(environment, base), folder, cwd, path)
    else:
        child = subject.in_child(
            ["-m", "mizuoto_contract.isolated", *argv], environment, folder, base=base, cwd=cwd
        )
    subject.shared["isolated"] = (child, folder)


def report(subject: Subject) -> dict[str, Any]:
    """The isolated run's report, waiting for it if needed (starting it if nobody did)."""

    start(subject)
    cached = subject.shared.get("isolated_report")
    if cached is None:
        child, folder = subject.shared["isolated"]
        try:
            cached = child_result(
                child, "the engine's life to run in a fresh process", _TIMEOUT_SECONDS
            )
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


def _end_leftovers(before: dict[int, str]) -> None:
    """Kill and reap the child processes the engine left (they are reported already), so that
    none outlives the run."""
    for pid in child_processes():
        if pid in before:
            continue
        with contextlib.suppress(OSError):
            os.kill(pid, getattr(signal, "SIGKILL", signal.SIGTERM))
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


def _main(engine_id: str, device: str, text: str) -> dict[str, Any]:
    import gc

    import numpy  # noqa: F401 - imported before the baseline, so that importing is no change

    with contextlib.suppress(ImportError):  # where torch is not installed, torch-free engines
        import torch  # noqa: F401

    import mizuoto_runtime.runtime  # noqa: F401
    from mizuoto_contract.snapshot import snapshot
    from mizuoto_sdk.host import Discovery

    temp = tempfile.gettempdir()
    baseline = snapshot()
    processes0, temps0 = child_processes(), set(os.listdir(temp))
    out: dict[str, Any] = {"state": {}, "processes": {}, "temp_files": {}}
    state: dict[str, Any] = {"previous": baseline}

    def measure(phase: str, processes: dict[int, str], temps: set[str]) -> None:
        now = snapshot()
        # Changed in this phase and not back to the baseline (a load's change that unload
        # undoes is the load's, not the unload's).
        moved = {c.name for c in baseline.diff(now)}
        changes = [c for c in state["previous"].diff(now) if c.name in moved]
        if changes:
            out["state"][phase] = [str(c) for c in changes]
        state["previous"] = now
        extra = {p: w for p, w in child_processes().items() if p not in processes}
        if extra:
            out["processes"][phase] = [f"pid {p} ({w})" for p, w in sorted(extra.items())]
        left = sorted(set(os.listdir(temp)) - temps)
        if left:
            out["temp_files"][phase] = [os.path.join(temp, name) for name in left]

    def run(
        phase: str,
        body: Callable[[], object],
        processes: dict[int, str] | None = None,
        temps: set[str] | None = None,
    ) -> bool:
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
        measure(
            phase,
            processes0 if processes is None else processes,
            temps0 if temps is None else temps,
        )
        return True

    names: dict[str, Any] = {}

    def imported() -> None:
        names["subject"] = subject_for(engine_id, device, Discovery())
        names["subject"].text = text
        names["subject"].discovery.get_engine(engine_id)

    if not run("import", imported):
        return out
    subject = names["subject"]

    def loaded() -> None:
        names["service"] = subject.service()
        names["handle"] = subject.load(names["service"])

    if not run("load", loaded):
        return out
    if subject.capability is not None:

        def call() -> None:
            out["digest"] = digest(subject.audio(names["handle"], SEED))

        if not run("call", call):
            return out
        after_call = (child_processes(), set(os.listdir(temp)))
        steps: list[tuple[str, Callable[[], object]]] = [
            ("second call", lambda: subject.audio(names["handle"], SEED)),
            ("early close", lambda: subject.close_early(names["handle"])),
            (
                "cancel",
                lambda: out.__setitem__("cancel", interrupt_host(subject, names["handle"]).outcome),
            ),
        ]
        for phase, body in steps:
            if not run(phase, body, *after_call):
                return out

    def unloaded() -> None:
        names["service"].unload()
        names.pop("handle")
        gc.collect()

    run("unload", unloaded)
    return out


def main(argv: list[str]) -> None:
    """Run ``ENGINE DEVICE TEXT`` and print the report as one JSON line."""
    try:
        print(json.dumps(_main(*argv[:3])), flush=True)
    finally:
        _end_leftovers({})


if __name__ == "__main__":
    import faulthandler

    faulthandler.enable(all_threads=True)  # a crash leaves every thread's stack in stderr
    main(sys.argv[1:])
