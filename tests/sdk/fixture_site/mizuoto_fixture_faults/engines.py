"""Engine classes: two declare dtypes the SDK cannot read, one waits inside synthesize, one
calls sys.exit in load."""

import sys
import threading

from mizuoto_sdk import Engine, LoadedEngine


class UnknownDtypeEngine(Engine):
    DEVICES = ("cpu",)
    DTYPES = ("float8",)


class NumberDtypesEngine(Engine):
    DEVICES = ("cpu",)
    DTYPES = 16


class ExitingLoadEngine(Engine):
    DEVICES = ("cpu",)

    def load(self, spec, runtime, ctx):
        sys.exit(7)


class WaitingEngine(Engine):
    """Says "synthesizing" on stderr once inside ``synthesize``, then waits to be stopped."""

    DEVICES = ("cpu",)

    def load(self, spec, runtime, ctx):
        return _Waiting()


class _Waiting(LoadedEngine):
    def synthesize(self, text, params, ctx):
        print("synthesizing", file=sys.stderr, flush=True)
        stop = threading.Event()
        for _ in range(600):  # at most a minute, should the signal never come
            ctx.check_cancel()
            stop.wait(0.1)
        yield from ()
