"""``mizuoto convert``: a WAV file through an engine's ``convert`` into another (or stdout)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from mizuoto_sdk.cli.common import add_call_options, local_voice, request_params
from mizuoto_sdk.cli.output import add_output_option, collect, report, wav_output, wav_target
from mizuoto_sdk.cli.progress import Progress
from mizuoto_sdk.cli.settings import add_set_option, host_settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    convert_ = commands.add_parser(
        "convert", help="convert a WAV file with an engine (voice conversion, enhancement ...)"
    )
    convert_.add_argument("engine", metavar="ENGINE", help="an engine id (`mizuoto engines`)")
    convert_.add_argument(
        "input",
        type=Path,
        metavar="IN.wav",
        help="the audio to convert: 8/16/24/32-bit PCM or float WAV, any channels",
    )
    add_output_option(convert_)
    add_call_options(convert_, voice=True)
    add_set_option(convert_)
    convert_.set_defaults(handler=convert)


def convert(args: argparse.Namespace) -> int:
    from mizuoto_sdk.audio import read_wav, write_wav
    from mizuoto_sdk.host import EngineRequest, RuntimeService

    target = wav_target(args.output, args.json)
    audio_in = read_wav(args.input)
    started = time.perf_counter()
    engine = RuntimeService(settings=host_settings(args.set)).engine(args.engine, args.device)
    voice = local_voice(engine.host.settings, args.voice)
    params = request_params(engine.manifest, args.param, seed=args.seed, voice=voice)
    progress = Progress()
    try:
        with wav_output(target) as sink:
            handle = engine.load(args.model, dtype=args.dtype)
            load_seconds = time.perf_counter() - started
            progress.restart()
            request = EngineRequest(params=params, progress=progress)
            empty = f"engine {args.engine!r} produced no audio for {args.input}"
            audio = collect(handle.convert(audio_in, request), empty)
            write_wav(sink, audio[0], audio[1])
    except BaseException:
        progress.abandon()
        raise
    report(args, engine.manifest, request, load_seconds, audio, progress)
    return 0
