"""``mizuoto settings``: each effective setting, its value, and where that value came from."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mizuoto_sdk.host import Settings

SET_HELP = (
    "set a setting for this run, KEY=VALUE (the value read as TOML when it parses, such as 2, "
    "true or ['a'], else as text); repeatable, later ones win; default: the settings files' values"
)


def add_set_option(parser: argparse.ArgumentParser) -> None:
    """``--set KEY=VALUE``, repeatable, on every command that runs a host."""
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", dest="set", help=SET_HELP
    )


def host_settings(overrides: Sequence[str]) -> Settings:
    """The settings a command's host runs with: the settings files, then ``--set``."""
    from mizuoto_sdk.host.sources import effective_settings

    return effective_settings(overrides)[0]


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    settings_ = commands.add_parser(
        "settings", help="show each effective setting, its value and where it came from"
    )
    settings_.add_argument(
        "--json", action="store_true", help="print one JSON object; default: a table"
    )
    add_set_option(settings_)
    settings_.set_defaults(handler=settings)


def _shown(value: object) -> str:
    return "none" if value is None else json.dumps(value, default=str)


def settings(args: argparse.Namespace) -> int:
    from mizuoto_sdk.host.sources import SETTINGS_VARIABLE, effective_settings, user_settings_file

    values, origin = effective_settings(args.set)
    user = user_settings_file()
    named = os.environ.get(SETTINGS_VARIABLE) or None
    current = values.as_dict()
    if args.json:
        document = {
            "user_file": str(user),
            "user_file_exists": user.is_file(),
            "settings_file": named,
            "settings": {
                key: {"value": value, "source": origin[key]} for key, value in current.items()
            },
        }
        print(json.dumps(document, indent=2, default=str))
        return 0
    print(f"user settings file: {user}{'' if user.is_file() else ' (absent)'}")
    print(f"{SETTINGS_VARIABLE}: {named or 'unset'}")
    table = [("KEY", "VALUE", "SOURCE")]
    table += [(key, _shown(value), origin[key]) for key, value in current.items()]
    widths = [max(len(row[i]) for row in table) for i in range(2)]
    for key, value, source in table:
        print(f"{key.ljust(widths[0])}  {value.ljust(widths[1])}  {source}")
    return 0
