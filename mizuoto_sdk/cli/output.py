"""Where a command's audio goes (a WAV file written atomically, or standard output) and what the
command says about it (lines, or one JSON object on stdout)."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO, TextIO

from mizuoto_sdk.cli.common import Usage
from mizuoto_sdk.cli.progress import Progress
from mizuoto_sdk.errors import EngineError

if TYPE_CHECKING:
    import numpy as np

    from mizuoto_sdk.host import EngineRequest
    from mizuoto_sdk.host.service import ServedModel
    from mizuoto_sdk.manifest import EngineManifest
    from mizuoto_sdk.types import AudioChunk

FORMATS = (".wav",)
"""The audio formats a command writes, by file extension."""


def add_output_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-o",
        "--output",
        required=True,
        metavar="OUT.wav",
        help="the WAV file to write (replaced only when the run succeeds), or - for standard "
        "output; required",
    )


def wav_target(text: str, json_: bool = False) -> Path | None:
    """``-o``'s value checked before any work: a ``.wav`` file that is no folder, or None for
    ``-`` (standard output)."""
    if text == "-":
        if json_:
            raise Usage("-o - and --json both write to standard output; give a file to -o")
        return None
    path = Path(text)
    try:
        is_folder = path.is_dir()
    except OSError as error:  # a name too long for the file system, a loop of links ...
        raise Usage(f"cannot write {path}: {error.strerror or error}") from None
    if is_folder:
        raise Usage(f"-o {path} is a folder; give a file name such as out.wav")
    if path.suffix.lower() not in FORMATS:
        raise Usage(
            f"-o {text}: {path.suffix or 'a name without an extension'} is not a supported "
            f"format; give a name ending in {', '.join(FORMATS)}"
        )
    return path


@contextlib.contextmanager
def wav_output(target: Path | None) -> Iterator[Path | BinaryIO]:
    """What to write the WAV into: a temporary file that becomes ``target`` when the block
    succeeds, or (``target`` None) a buffer that reaches standard output only then."""
    from mizuoto_sdk.audio import AtomicFile

    if target is None:
        buffer = io.BytesIO()
        yield buffer
        stdout = sys.stdout.buffer
        stdout.write(buffer.getvalue())
        stdout.flush()
        return
    try:
        output = AtomicFile(target)
    except OSError as error:
        raise Usage(f"cannot write {target}: {error.strerror or error}") from None
    with output as temporary:
        yield temporary


def collect(chunks: Iterable[AudioChunk], empty: str) -> tuple[np.ndarray, int, int]:
    """``(samples, sample_rate, chunk count)`` of a stream of host chunks (float32 mono)."""
    import numpy as np

    parts, rates = [], set()
    for chunk in chunks:
        parts.append(chunk.samples)
        rates.add(chunk.sample_rate)
    if not parts:
        raise EngineError(empty)
    if len(rates) > 1:
        raise EngineError(f"the engine's chunks change sample rate ({sorted(rates)} Hz)")
    return np.concatenate(parts), rates.pop(), len(parts)


def messages(target: Path | None, json_: bool) -> TextIO:
    """Where the lines for a person go: stderr when stdout carries the audio or the JSON."""
    return sys.stderr if target is None or json_ else sys.stdout


def applied_record(manifest: EngineManifest, request: EngineRequest) -> dict[str, object]:
    """What the call applied, as a command reports it: the host seeds every call, but only a
    ``stochastic`` engine's output depends on its seed, so another engine's report names none
    (``seed`` null, no ``applied.seed``) rather than a random number that changed nothing."""
    if manifest.stochastic:
        return dict(request.applied)
    return {key: value for key, value in request.applied.items() if key != "seed"}


def report(
    args: argparse.Namespace,
    manifest: EngineManifest,
    request: EngineRequest,
    load_seconds: float,
    audio: tuple[np.ndarray, int, int],
    progress: Progress,
) -> None:
    """The lines (or the JSON object) that end a command that wrote audio."""
    samples, rate, count = audio
    duration = len(samples) / rate
    timings = {"load": load_seconds, **request.timings}
    applied = applied_record(manifest, request)
    seed = applied.get("seed")
    progress.finish(f"{duration:.2f} s of audio in {count} chunks")
    if args.json:
        record = {
            "engine": manifest.id,
            "output": args.output,
            "duration": duration,
            "sample_rate": rate,
            "chunks": count,
            "seed": seed,
            "params": request.params,
            "timings": timings,
            "applied": applied,
            "warnings": request.warnings,
        }
        print(json.dumps(record, default=str))
        return
    out = messages(None if args.output == "-" else Path(args.output), False)
    name = "standard output" if args.output == "-" else args.output
    print(
        f"wrote {name}: {duration:.2f} s of audio at {rate} Hz in {count} chunks"
        + (f" (seed {seed})" if seed is not None else ""),
        file=out,
    )
    for warning in request.warnings:
        print(f"warning: {warning}", file=out)
    print(
        f"timings: load {load_seconds:.3f} s, first chunk {timings.get('first_chunk', 0):.3f}"
        f" s, total {timings.get('total', 0):.3f} s",
        file=out,
    )


def write_audio(
    args: argparse.Namespace,
    target: Path | None,
    run: Callable[[ServedModel, EngineRequest], Iterable[AudioChunk]],
    source: str,
) -> int:
    """What ``synth`` and ``convert`` share: the host with the run's settings, the request's
    params, the model loaded as its deployment settings place it (in this process, or worker
    processes for ``engines.<id>.replicas`` and friends), ``run(model, request)`` collected and
    written to ``target`` (a file, atomically, or standard output when None), then the report.
    ``source`` names the input in the message for an engine that yields nothing. The host is
    closed before the command returns, so no worker outlives it. Under an external launcher
    (torchrun, ``deployment = external``) every rank runs the command; only the output rank
    writes the audio, the others compute their part of it."""
    import time

    from mizuoto_sdk.audio import write_wav
    from mizuoto_sdk.cli.common import local_voice, request_params
    from mizuoto_sdk.cli.settings import host_settings
    from mizuoto_sdk.host import EngineRequest, RuntimeService

    started = time.perf_counter()
    with RuntimeService(settings=host_settings(args.set)) as service:
        manifest = service.discovery.manifest(args.engine)
        voice = local_voice(service.settings, manifest, args.voice)
        params = request_params(manifest, args.param, seed=args.seed, voice=voice)
        model = service.load(args.engine, args.model, device=args.device, dtype=args.dtype)
        if not getattr(model, "output", True):  # one rank under a launcher, not the output one
            for _ in run(model, EngineRequest(params=params)):
                pass  # it steps with the output rank, which writes the audio
            print(
                f"{model.name}: this rank computed its part; the output rank writes {args.output}"
            )
            return 0
        progress = Progress()
        try:
            with wav_output(target) as sink:
                model.start()  # worker processes start now: their startup is part of the load
                load_seconds = time.perf_counter() - started
                progress.restart()  # the call's own time; loading is not part of it
                request = EngineRequest(params=params, progress=progress)
                empty = f"engine {args.engine!r} produced no audio for {source}"
                audio = collect(run(model, request), empty)
                write_wav(sink, audio[0], audio[1])
        except BaseException:
            progress.abandon()
            raise
    report(args, manifest, request, load_seconds, audio, progress)
    return 0
