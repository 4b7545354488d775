"""An engine whose work is a child process: run to its end (``call``) or streamed (``synthesize``).

``STARTED`` collects the pids of the children it starts, so tests can check each was reaped;
``ENDED`` the texts of the streams whose ``finally`` ran. ``call("hold")`` waits for ``RELEASE``
and checks no cancel: an engine stuck where no stop reaches it.
"""

import subprocess
import sys
import threading

import numpy as np

from mizuoto_sdk import AudioChunk, Engine, EngineManifest, LoadedEngine, ModelEntry, hookimpl

STARTED = []
ENDED = []
HOLDING = threading.Event()
RELEASE = threading.Event()
_REPEAT = "import sys\nwhile True:\n    print(sys.argv[1], flush=True)"


class ProcessEngine(Engine):
    DEVICES = ("cpu",)

    def load(self, spec, runtime, ctx):
        return _Loaded()


class _Loaded(LoadedEngine):
    def call(self, op, payload, ctx):
        if op == "sleep":  # blocks in the child until it ends or is killed
            with ctx.open_process(["sleep", "30"]) as process:
                STARTED.append(process.pid)
                process.wait()
            return {"returncode": process.returncode}
        if op == "hold":
            HOLDING.set()
            RELEASE.wait(60)
            return {}
        if op == "run":
            done = ctx.run_process(list(payload["args"]), capture_output=True, text=True)
            return {"returncode": done.returncode, "stdout": done.stdout}
        return super().call(op, payload, ctx)

    def synthesize(self, text, params, ctx):
        """One int16 chunk per line the child prints; it prints ``text`` until it is killed."""
        args = [sys.executable, "-c", _REPEAT, text]
        try:
            with ctx.open_process(args, stdout=subprocess.PIPE, text=True) as process:
                STARTED.append(process.pid)
                for line in process.stdout:
                    yield AudioChunk(np.full(4, int(line), np.int16), 16000)
        finally:
            ENDED.append(text)


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id="process",
            implementation="mizuoto_fixture_process:ProcessEngine",
            models=[ModelEntry("a")],
            capabilities=["synthesize", "call"],
            devices=["cpu"],
        )
    ]
