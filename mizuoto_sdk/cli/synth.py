"""``mizuoto synth``: text to a WAV file (or standard output) through the host, streamed, atomic."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from mizuoto_sdk.cli.common import Usage, add_call_options
from mizuoto_sdk.cli.output import add_output_option, wav_target, write_audio
from mizuoto_sdk.cli.settings import add_set_option


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
    text = read_text(args)
    target = wav_target(args.output, args.json)
    return write_audio(
        args, target, lambda model, request: model.synthesize(text, request), repr(text)
    )
