"""What every command shares: the usage error (exit 2), the codes that count as usage, and the
options and params of the commands that call an engine."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mizuoto_sdk.params import HOST_PARAMS

if TYPE_CHECKING:
    from mizuoto_sdk.host.settings import Settings
    from mizuoto_sdk.manifest import EngineManifest

USAGE_CODES = {"engine_not_found", "invalid_request", "capability_not_supported"}


class Usage(Exception):
    """A mistake in how the command was called: printed, exit 2."""


def say(where: str, as_json: bool) -> None:
    """Where a command's answer comes from (a server, or this process), one line: on stdout
    before the lines, on stderr when stdout is JSON."""
    print(where, file=sys.stderr if as_json else sys.stdout)


def server_failure(error: Exception) -> int:
    """A server that answered with a code that is not an engine's (``unauthorized``, ...), or
    stopped answering: printed like an engine error, exit 1."""
    code = getattr(error, "code", "server_unreachable")
    print(f"mizuoto: error [{code}]: {error}", file=sys.stderr)
    return 1


def mib(count: object) -> str:
    return f"{int(count) / 2**20:.1f} MiB"  # type: ignore[call-overload]  # a byte count


def add_call_options(parser: argparse.ArgumentParser, *, voice: bool = False) -> None:
    """The options of every command that calls an engine: its params, seed, placement, --json."""
    parser.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a request param, typed by the engine's declaration (`mizuoto engines --json` lists "
        "them); repeatable; default: none, the engine's defaults apply",
    )
    if voice:
        parser.add_argument(
            "--voice",
            metavar="VOICE",
            help="the engine's `voice` param: a prepared voice (`mizuoto voice prepare`), read "
            "from the current folder when the engine declares `voice` a path, else given as "
            "is (a voice name); default: the engine's own voice",
        )
    parser.add_argument(
        "--seed",
        type=int,
        help="an integer >= 0: the same seed gives the same output; default: a random one",
    )
    parser.add_argument(
        "--device", help="cpu, cuda, cuda:1, ...; default: the engine's first available device"
    )
    parser.add_argument(
        "--dtype", help="float32, bfloat16, float16; default: the engine's choice for the device"
    )
    parser.add_argument("--model", help="a model id of the engine; default: its first model")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object on stdout instead of lines; default: lines",
    )


def request_params(
    manifest: EngineManifest,
    pairs: Sequence[str],
    *,
    seed: int | None = None,
    voice: str | None = None,
) -> dict[str, object]:
    """The request params of ``--param NAME=VALUE`` (and ``--seed``, ``--voice``), each typed by
    the engine's declaration; an engine that declares none gets the text as given.

    A malformed pair or a name given twice is a usage mistake; an unknown name or a bad value is
    the manifest's own ``invalid_request``, which lists the known names.
    """
    declared = {p.name: p for p in (*manifest.params, *HOST_PARAMS)}
    params: dict[str, object] = {}
    for pair in pairs:
        name, equals, text = pair.partition("=")
        name = name.strip()
        if not equals or not name:
            raise Usage(f"--param {pair!r}: expected NAME=VALUE, such as --param speed=1.5")
        if name in params:
            raise Usage(f"--param {name}: given twice; give each param once")
        if name in declared:
            params[name] = declared[name].parse(text)
        else:  # no declarations: the text as given; an unknown name: the manifest's refusal
            params.update(manifest.check_params({name: text}))
    for option, name, value in (("--seed", "seed", seed), ("--voice", "voice", voice)):
        if value is None:
            continue
        if name in params:
            raise Usage(f"{option} and --param {name} both set {name}; give one of them")
        if name not in declared:
            raise Usage(
                f"{option}: engine {manifest.id!r} declares no {name!r} param, so it takes no "
                f"{option}"
            )
        params[name] = declared[name].check(value)
    return params


def local_voice(settings: Settings, manifest: EngineManifest, voice: str | None) -> str | None:
    """``--voice VOICE`` as the host receives it. For an engine that declares ``voice`` a
    ``path``: an absolute path (a relative one is read from the current folder), whose folder
    this run allows in ``voices.roots``. Any other ``voice`` (a ``str``: a voice name such as
    ``de``) is given as typed.

    ``voices.roots`` keeps requests from reading files their senders choose; at the command line
    the sender is the operator, who names the file themselves.
    """
    declared = {p.name: p.type for p in manifest.params}
    if voice is None or declared.get("voice") != "path":
        return voice
    path = os.path.abspath(voice)
    roots = [os.fspath(root) for root in settings.get("voices.roots") or ()]
    settings.set("voices.roots", [*roots, os.path.dirname(path)])
    return path
