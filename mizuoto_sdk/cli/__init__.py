"""The ``mizuoto`` command. Listing, doctor and runtime never import torch; synth does, to load.

Exit codes: 0 ok, 2 a usage mistake (bad arguments, unknown engine, empty text, unwritable
output), 1 an engine error, printed with its code. Stopped by SIGINT or SIGTERM, the command
cleans up, prints one line and ends by that signal. One module per command (``engines`` also
holds ``doctor``); each adds its subparser in ``register`` and names its handler.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mizuoto_sdk.cli import (
    agent,
    convert,
    engines,
    models,
    runtime,
    serve,
    settings,
    synth,
    voice,
    wyoming,
)
from mizuoto_sdk.cli.common import USAGE_CODES, Usage
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.process import run_command

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService

__all__ = ["main", "run"]


DEBUG_HELP = "on an engine error, print its full traceback, the engine's own frames included"


def _version() -> str:
    try:
        return importlib.metadata.version("mizuoto-sdk")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return "unknown (mizuoto-sdk is not installed)"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mizuoto", description="Run Mizuoto speech engines.")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {_version()}", help="print the version"
    )
    parser.add_argument("--debug", action="store_true", help=DEBUG_HELP)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for command in (
        engines,
        synth,
        convert,
        voice,
        runtime,
        settings,
        models,
        agent,
        serve,
        wyoming,
    ):
        command.register(commands)
    for subparser in commands.choices.values():  # --debug after the command name works too
        subparser.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help=DEBUG_HELP
        )
    return parser


def run() -> None:
    """The ``mizuoto`` executable: ``main`` on ``sys.argv``, then the process ends with its code.

    SIGINT and SIGTERM unwind the command (an unfinished output file is removed) and end the
    process by that signal after one line on stderr; threads a plugin left running never keep it
    alive (``mizuoto_sdk.process``).
    """
    run_command(main, "mizuoto")


def main(argv: Sequence[str] | None = None, service: RuntimeService | None = None) -> int:
    """Run the command; ``service`` is the host whose models ``runtime`` shows (default: new).

    Embedding processes call this: it returns the exit code and leaves signals and threads alone.
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage message (or the version)
        return int(exit_.code or 0)
    if args.command is None:
        parser.print_help()
        return 0
    args.service = service
    try:
        return int(args.handler(args))
    except Usage as error:
        print(f"mizuoto: error: {error}", file=sys.stderr)
        return 2
    except EngineError as error:
        if args.debug:
            _print_traceback(error)
        print(f"mizuoto: error [{error.code}]: {error}", file=sys.stderr)
        return 2 if error.code in USAGE_CODES else 1
    except SystemExit as exit_:  # engine or plugin code ended the command: say so, never silently
        if args.debug:
            _print_traceback(exit_)
        print(
            f"mizuoto: error: engine or plugin code called sys.exit({exit_.code!r})",
            file=sys.stderr,
        )
        return 1


def _print_traceback(error: BaseException) -> None:
    """``--debug``: where the error was raised, with its causes, and the engine's own traceback
    when the host caught an exception from the engine and kept it in ``detail["traceback"]``."""
    print("".join(traceback.format_exception(error)), end="", file=sys.stderr)
    detail = getattr(error, "detail", None)
    engine_traceback = detail.get("traceback") if isinstance(detail, dict) else None
    if isinstance(engine_traceback, str) and engine_traceback:
        print("\nraised in the engine:", file=sys.stderr)
        print(
            engine_traceback, end="" if engine_traceback.endswith("\n") else "\n", file=sys.stderr
        )
