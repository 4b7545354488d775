"""Child processes that stop with the call: killed with their process group on cancel or timeout.

Work in a child process blocks outside Python, where ``check_cancel()`` never runs. The child
starts in a new session, so it leads a process group of its own (group id = its pid), and an
``on_cancel`` callback kills that whole group: a shell and what it started die together, and
nothing else does. Leaving the block kills the group if the child still runs and always reaps
the child, so an engine whose stream the caller closes early leaves neither a running child nor a
zombie behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator, Sequence
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
    process = subprocess.Popen(args, start_new_session=True, **popen)
    group = _Group(process)
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
