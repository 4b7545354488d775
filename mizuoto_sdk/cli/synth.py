"""``mizuoto synth``: text to a WAV file (or standard output) through the host, streamed, atomic."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from mizuoto_sdk.cli.common import Usage, add_call_options, local_voice, request_params
from mizuoto_sdk.cli.output import add_output_option, collect, report, wav_output, wav_target
from mizuoto_sdk.cli.progress import Progress
from mizuoto_sdk.cli.settings import add_set_option, host_settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    synth_ = commands.add_parser("synth", help="synthesize TEXT into a WAV file")
    synth_.add_argument("engine", metavar="ENGINE", help="an engine id (`mizuoto engines`)")
    synth_.add_argument(
        "text",
        metavar="TEXT",
        nargs="?",
        help="the words to say, or - to read them from standard input; required unless "
        "--text-file is given",
    )
    synth_.add_argument(
        "--text-file", type=Path, metavar="FILE", help="read the words from FILE (UTF-8)"
    )
    add_output_option(synth_)
    add_call_options(synth_, voice=True)
    add_set_option(synth_)
    synth_.set_defaults(handler=synth)


def read_text(args: argparse.Namespace) -> str:
    """The words from exactly one source: TEXT, ``-`` (standard input) or ``--text-file``."""
    if (args.text is None) == (args.text_file is None):
        raise Usage("give the words as TEXT, as - (standard input) or with --text-file, once")
    if args.text_file is not None:
        try:
            text: str = args.text_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as error:
            reason = error.strerror if isinstance(error, OSError) else error
            raise Usage(f"--text-file {args.text_file}: cannot be read: {reason}") from None
        source = f"--text-file {args.text_file}"
    elif args.text == "-":
        text, source = sys.stdin.read(), "standard input"
    else:
        text, source = args.text, "TEXT"
    if not text.strip():
        raise Usage(f"{source} is empty: give the words to synthesize")
    return text


def synth(args: argparse.Namespace) -> int:
    from mizuoto_sdk.host import EngineRequest, RuntimeService

    text = read_text(args)
    target = wav_target(args.output, args.json)
    started = time.perf_counter()
    service = RuntimeService(settings=host_settings(args.set))
    engine = service.engine(args.engine, args.device)
    voice = local_voice(engine.host.settings, args.voice)
    params = request_params(engine.manifest, args.param, seed=args.seed, voice=voice)
    progress = Progress()
    try:
        with wav_output(target) as sink:
            from mizuoto_sdk.audio import write_wav

            handle = engine.load(args.model, dtype=args.dtype)
            load_seconds = time.perf_counter() - started
            progress.restart()  # the call's own time; loading is not part of it
            request = EngineRequest(params=params, progress=progress)
            empty = f"engine {args.engine!r} produced no audio for {text!r}"
            audio = collect(handle.synthesize(text, request), empty)
            write_wav(sink, audio[0], audio[1])
    except BaseException:
        progress.abandon()
        raise
    report(args, engine.manifest, request, load_seconds, audio, progress)
    return 0
