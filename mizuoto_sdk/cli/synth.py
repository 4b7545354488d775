"""``mizuoto synth``: text to a WAV file through the host, streamed, atomic."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mizuoto_sdk.cli.common import Usage
from mizuoto_sdk.cli.settings import add_set_option, host_settings
from mizuoto_sdk.errors import EngineError


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    synth_ = commands.add_parser("synth", help="synthesize TEXT into a WAV file")
    synth_.add_argument("engine", metavar="ENGINE")
    synth_.add_argument("text", metavar="TEXT")
    synth_.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.wav")
    synth_.add_argument("--seed", type=int)
    synth_.add_argument("--device")
    synth_.add_argument("--dtype")
    synth_.add_argument("--model")
    add_set_option(synth_)
    synth_.set_defaults(handler=synth)


class _Progress:
    """Progress lines on stderr, only once a run has taken longer than ``delay`` seconds."""

    def __init__(self, delay: float = 0.5, every: float = 0.25) -> None:
        self._start = time.perf_counter()
        self._delay, self._every, self._last = delay, every, 0.0

    def __call__(self, done: float, total: float | None, message: str | None) -> None:
        now = time.perf_counter() - self._start
        if now < self._delay or now - self._last < self._every:
            return
        self._last = now
        amount = f"{done:g}/{total:g}" if total else f"{done:g}"
        print(
            f"progress {amount}{f' {message}' if message else ''} ({now:.1f} s)",
            file=sys.stderr,
            flush=True,
        )


def synth(args: argparse.Namespace) -> int:
    from mizuoto_sdk.audio import AtomicFile, write_wav
    from mizuoto_sdk.host import EngineRequest, RuntimeService

    if not args.text.strip():
        raise Usage("TEXT is empty: give the words to synthesize")
    try:
        is_folder = args.output.is_dir()
    except OSError as error:  # a name too long for the file system, a loop of links ...
        raise Usage(f"cannot write {args.output}: {error.strerror or error}") from None
    if is_folder:
        raise Usage(f"-o {args.output} is a folder; give a file name such as out.wav")
    started = time.perf_counter()
    service = RuntimeService(settings=host_settings(args.set))
    engine = service.engine(args.engine, args.device)
    try:
        output = AtomicFile(args.output)
    except OSError as error:
        raise Usage(f"cannot write {args.output}: {error.strerror or error}") from None
    with output as temporary:
        handle = engine.load(args.model, dtype=args.dtype)
        loaded = time.perf_counter()
        request = EngineRequest(
            params={} if args.seed is None else {"seed": args.seed}, progress=_Progress()
        )
        chunks = list(handle.synthesize(args.text, request))
        if not chunks:
            raise EngineError(f"engine {args.engine!r} produced no audio for {args.text!r}")
        import numpy as np

        samples, rate = np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate
        write_wav(temporary, samples, rate)
    timings = request.timings
    print(
        f"wrote {args.output}: {len(samples) / rate:.2f} s of audio at {rate} Hz in "
        f"{len(chunks)} chunks (seed {request.applied.get('seed')})"
    )
    print(
        f"timings: load {loaded - started:.3f} s, first chunk {timings.get('first_chunk', 0):.3f}"
        f" s, synthesis {timings.get('total', 0):.3f} s"
    )
    return 0
