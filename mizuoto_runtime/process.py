"""Child processes that stop with the call: killed with their process group on cancel or timeout.

Work in a child process blocks outside Python, where ``check_cancel()`` never runs. The child
starts in a new session, so it leads a process group of its own (group id = its pid), and an
``on_cancel`` callback kills that whole group: a shell and what it started die together, and
nothing else does. Leaving the block kills the group if the child still runs and always reaps
the child, so an engine whose stream the caller closes early leaves neither a running child nor a
zombie behind.

A child also dies with the process that owns it, whatever ends that process:

- Linux: the child is forked from one long-lived thread of this process with the parent-death
  signal set to SIGKILL (``prctl(PR_SET_PDEATHSIG)``), so the kernel kills it when this process
  ends, even by SIGKILL. The signal follows the thread that forked, not the process, hence the one
  thread that lives as long as the process. It reaches the child itself; what the child started
  in turn is killed by the host's stop (``kill_children``) or by the child's own exit handling.
- Elsewhere (macOS, Windows): no such signal exists; the hosts (worker, agent, server, CLI) call
  ``kill_children()`` on every stop they survive, and an exit handler does it on a normal exit.

``kill_children()`` kills the process group of every child this process started through
``open_process`` that still runs: a host calls it when it stops, after its calls had their
bounded time to unwind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from typing import Any, Protocol


class Cancellable(Protocol):
    """What a child process needs of the call (``RequestContext`` is one)."""

    @property
    def cancelled(self) -> bool: ...

    def check_cancel(self) -> None: ...

    def on_cancel(
        self, callback: Callable[[], None]
    ) -> contextlib.AbstractContextManager[object]: ...


_OWNED = ("start_new_session", "process_group", "preexec_fn")


class _Group:
    """Kills the child's process group, only while the child is unreaped (its pid still ours)."""

    def __init__(self, process: subprocess.Popen[Any]) -> None:
        self._process = process
        self._lock = threading.Lock()

    def kill(self) -> None:
        with self._lock:
            # Once reaped, the pid (and so the group id) may belong to someone else.
            if self._process.returncode is not None:
                return
            if os.name == "nt":
                with contextlib.suppress(OSError):
                    self._process.kill()
                return
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._process.pid, signal.SIGKILL)


class _Children:
    """The groups of the children that run now: what ``kill_children`` kills."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: set[_Group] = set()
        self._hooked = False
        if hasattr(os, "register_at_fork"):  # a forked process owns none of these children
            os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._groups = set()

    def add(self, group: _Group) -> None:
        with self._lock:
            self._groups.add(group)
            if not self._hooked:  # once, at the first child: a normal exit kills what is left
                atexit.register(self.kill)
                self._hooked = True

    def discard(self, group: _Group) -> None:
        with self._lock:
            self._groups.discard(group)

    def kill(self) -> int:
        with self._lock:
            groups = list(self._groups)
        for group in groups:
            group.kill()
        return len(groups)


_children = _Children()


def kill_children() -> int:
    """Kill the process group of every child started through ``open_process`` in this process
    that still runs; returns how many there were. Their ``with`` blocks still reap them."""
    return _children.kill()


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, resolved in the parent (never in the child between fork and exec); None
    where there is none to ask (not Linux, or no C library)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


class _Spawner:
    """The one thread that forks every child on Linux, alive as long as the process, so that the
    parent-death signal fires when the process ends and not when a request thread ends."""

    def __init__(self) -> None:
        self._prctl = _prctl()
        self._reset()
        if hasattr(os, "register_at_fork"):  # a forked process has no spawner thread of its own
            os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], subprocess.Popen[Any]], Future[Any]]]
        self._jobs = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, args: Sequence[str | os.PathLike[str]], **popen: Any) -> subprocess.Popen[Any]:
        prctl = self._prctl
        if prctl is None:
            return subprocess.Popen(args, start_new_session=True, **popen)
        parent = os.getpid()

        def arm() -> None:  # in the child, before exec
            prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
            if os.getppid() != parent:  # the owner died between the fork and the request
                os._exit(1)

        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="mizuoto-child-spawner", daemon=True
                )
                self._thread.start()
        done: Future[subprocess.Popen[Any]] = Future()
        self._jobs.put(
            (lambda: subprocess.Popen(args, start_new_session=True, preexec_fn=arm, **popen), done)
        )
        return done.result()

    def _run(self) -> None:
        jobs = self._jobs  # this thread's queue, even after a fork resets the spawner
        while True:
            start, done = jobs.get()
            try:
                done.set_result(start())
            except BaseException as error:  # the caller's to raise, on its own thread
                done.set_exception(error)


_spawner = _Spawner()


@contextlib.contextmanager
def open_process(
    ctx: Cancellable, args: Sequence[str | os.PathLike[str]], **popen: Any
) -> Iterator[subprocess.Popen[Any]]:
    """Start ``args`` (``subprocess.Popen(args, **popen)``) for the ``with`` block.

    The child's process group is killed (SIGKILL) when ``ctx`` is cancelled or times out, and
    when the block is left while the child still runs (an error, or the host closing an engine's
    stream); the child is always reaped before the block ends. A block that ends after a cancel
    raises the call's CancelledError or OperationTimeoutError, so output cut short by the kill
    never passes for a finished result. Raises the same at once if ``ctx`` is already cancelled.
    """
    taken = sorted(set(_OWNED) & set(popen))
    if taken:
        raise TypeError(f"open_process: {', '.join(taken)} is set by open_process itself")
    ctx.check_cancel()
    process = _spawner.popen(args, **popen)
    group = _Group(process)
    _children.add(group)
    try:
        with ctx.on_cancel(group.kill):
            yield process
    except Exception:
        if ctx.cancelled:  # the kill is why the block failed (a broken pipe, a short read)
            ctx.check_cancel()
        raise
    finally:
        group.kill()
        process.wait()  # reaped before its pipes close, so it dies of the kill, not of a pipe
        _children.discard(group)
        for stream in (process.stdin, process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):  # unflushed input to a killed child
                    stream.close()
    ctx.check_cancel()


def run_process(
    ctx: Cancellable,
    args: Sequence[str | os.PathLike[str]],
    *,
    input: bytes | str | None = None,
    capture_output: bool = False,
    check: bool = False,
    **popen: Any,
) -> subprocess.CompletedProcess[Any]:
    """Run ``args`` to its end, like ``subprocess.run``, but killed on cancel or timeout.

    A cancelled or timed-out call raises CancelledError or OperationTimeoutError; ``check``
    raises ``subprocess.CalledProcessError`` for a non-zero exit status.
    """
    if capture_output:
        if "stdout" in popen or "stderr" in popen:
            raise TypeError("run_process: capture_output cannot be used with stdout or stderr")
        popen["stdout"] = popen["stderr"] = subprocess.PIPE
    if input is not None:
        if "stdin" in popen:
            raise TypeError("run_process: input cannot be used with stdin")
        popen["stdin"] = subprocess.PIPE
    with open_process(ctx, args, **popen) as process:
        stdout, stderr = process.communicate(input)
    returncode = process.returncode
    if check and returncode:
        raise subprocess.CalledProcessError(returncode, process.args, stdout, stderr)
    return subprocess.CompletedProcess(process.args, returncode, stdout, stderr)
