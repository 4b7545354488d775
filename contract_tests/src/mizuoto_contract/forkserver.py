"""The zygote's own process (``python -m mizuoto_contract.forkserver``): imports what every
isolated run needs once, then forks one child per request (protocol in ``zygote``)."""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from mizuoto_contract import childcheck, isolated


def _child(request: dict[str, Any]) -> None:
    """In the forked child: become the isolated run the request describes, then exit."""

    output = Path(request["output"])
    with open(output / "stdout", "w") as out, open(output / "stderr", "w") as err:
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
    with open(os.devnull) as nothing:
        os.dup2(nothing.fileno(), 0)
    # A crash (a segfault in native code, an abort) leaves every thread's stack in stderr.
    faulthandler.enable(all_threads=True)
    code = 1
    try:
        environment = {k: v for k, v in request["env"].items() if k != "PYTHONHASHSEED"}
        os.environ.clear()
        os.environ.update(environment)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
        sys.path[:] = request["path"]
        importlib.invalidate_caches()
        if request.get("run") == "check":
            childcheck.main(request["argv"])
        else:
            isolated.main(request["argv"])
        code = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _serve() -> None:
    import numpy  # noqa: F401 - the imports a fresh process would repeat, done once

    with contextlib.suppress(ImportError):  # where torch is not installed, torch-free engines
        import torch  # noqa: F401

    import mizuoto_contract.runner  # noqa: F401
    import mizuoto_runtime.runtime  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        sys.stdout.write(json.dumps({"pid": pid}) + "\n")
        sys.stdout.flush()
        _, status = os.waitpid(pid, 0)
        sys.stdout.write(json.dumps({"exit": os.waitstatus_to_exitcode(status)}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    _serve()
