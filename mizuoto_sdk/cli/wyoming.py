"""``mizuoto wyoming``: every synthesizing engine over the Wyoming protocol, for Home Assistant
(the ``wyoming`` extra), until Ctrl-C or SIGTERM.

Wyoming has no request params, so ``--param ENGINE.NAME=VALUE`` fixes what every request to that
engine carries (a seed, a speed), typed by the engine's declaration as ``synth --param`` is.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mizuoto_sdk.cli.common import Usage
from mizuoto_sdk.cli.settings import add_set_option, host_settings

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService

DEFAULT_URI = "tcp://127.0.0.1:10200"
EXTRA = 'pip install "mizuoto-sdk[wyoming]"'


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    wyoming = commands.add_parser(
        "wyoming", help="serve the engines over the Wyoming protocol (Home Assistant) until stopped"
    )
    wyoming.add_argument(
        "--uri",
        default=DEFAULT_URI,
        help=f"where to listen: tcp://HOST:PORT (port 0: a free one, printed) or unix://PATH; "
        f"default: {DEFAULT_URI} (this machine only; Home Assistant elsewhere needs "
        "tcp://0.0.0.0:10200)",
    )
    wyoming.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="ENGINE.NAME=VALUE",
        help="a param every request to ENGINE carries, such as sine.speed=1.5 or codeclm.seed=7; "
        "repeatable",
    )
    wyoming.add_argument(
        "--engine",
        action="append",
        default=[],
        metavar="ID",
        help="serve only this engine, repeatable, in this order (Home Assistant offers the first "
        "program's voices only); default: every engine that synthesizes, by id",
    )
    add_set_option(wyoming)
    wyoming.set_defaults(handler=wyoming_command)


def wyoming_command(args: argparse.Namespace) -> int:
    try:
        import wyoming  # noqa: F401
    except ImportError as error:
        raise Usage(
            f"mizuoto wyoming needs the wyoming extra ({error.name} is missing): {EXTRA}"
        ) from None
    if not args.uri.startswith(("tcp://", "unix://")):
        raise Usage(f"--uri {args.uri}: expected tcp://HOST:PORT or unix://PATH")
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.host.models import data_home
    from mizuoto_sdk.server.wyoming_server import Speakers, run

    service = RuntimeService(settings=host_settings(args.set))
    voices = data_home() / "voices"
    roots = [str(root) for root in service.settings.get("voices.roots") or ()]
    service.settings.set("voices.roots", [*roots, str(voices)])
    try:
        params = _engine_params(service, args.param)
        speakers = Speakers(service, voices, params, engines=args.engine or None)
    except BaseException:
        service.close()
        raise
    try:
        run(speakers, args.uri, _announce)
    except OSError as error:
        raise Usage(f"--uri {args.uri}: cannot listen: {error.strerror or error}") from None
    return 0


def _engine_params(service: RuntimeService, pairs: Sequence[str]) -> dict[str, dict[str, object]]:
    """``--param ENGINE.NAME=VALUE`` grouped by engine, each typed by its manifest."""
    from mizuoto_sdk.cli.common import request_params

    grouped: dict[str, list[str]] = {}
    for pair in pairs:
        engine, dot, rest = pair.partition(".")
        if not dot or "=" not in rest:
            raise Usage(f"--param {pair!r}: expected ENGINE.NAME=VALUE, such as sine.speed=1.5")
        grouped.setdefault(engine, []).append(rest)
    return {
        engine: request_params(service.discovery.manifest(engine), given)
        for engine, given in grouped.items()
    }


def _announce(where: str) -> None:
    import os

    print(f"mizuoto wyoming at {where} (pid {os.getpid()}); stop with Ctrl-C", file=sys.stderr)
    sys.stderr.flush()
