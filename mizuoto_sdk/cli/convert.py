"""``mizuoto convert``: a WAV file through an engine's ``convert`` into another (or stdout)."""

from __future__ import annotations

import argparse
from pathlib import Path

from mizuoto_sdk.cli.common import add_call_options
from mizuoto_sdk.cli.output import add_output_option, wav_target, write_audio
from mizuoto_sdk.cli.settings import add_set_option


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
    from mizuoto_sdk.audio import read_wav

    target = wav_target(args.output, args.json)
    audio_in = read_wav(args.input)
    return write_audio(
        args, target, lambda model, request: model.convert(audio_in, request), str(args.input)
    )
