"""``mizuoto engines`` and ``mizuoto doctor``: what is installed and whether it can run."""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import logging
import os
import shlex
import textwrap
import urllib.parse
from collections.abc import Iterator
from typing import TYPE_CHECKING, cast

from mizuoto_sdk import discovery
from mizuoto_sdk.cli.common import say, server_failure
from mizuoto_sdk.discovery import SELECTION_VARIABLE, Discovery
from mizuoto_sdk.hooks import ENTRY_POINT_GROUP
from mizuoto_sdk.host.inventory import Diagnosis, DoctorReport, doctor_report, engine_rows
from mizuoto_sdk.host.programs import Missing

if TYPE_CHECKING:
    from mizuoto_runtime.devices.probe import TorchBuild


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = commands.add_parser("engines", help="list installed engines")
    listing.add_argument(
        "--json", action="store_true", help="print every field as JSON; default: a table"
    )
    listing.set_defaults(handler=engines)
    checking = commands.add_parser("doctor", help="check torch and the engines' requirements")
    checking.add_argument(
        "engine", nargs="?", metavar="ENGINE", help="an engine id to check alone; default: all"
    )
    checking.add_argument(
        "--json", action="store_true", help="print the findings as JSON; default: lines"
    )
    checking.set_defaults(handler=doctor)


def engines(args: argparse.Namespace) -> int:
    with _failures_in_table():
        rows = engine_rows(Discovery())
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(_nothing_listed())
        return 0
    table = [["ID", "DISTRIBUTION", "VERSION", "STATUS", "DEVICES", "DTYPES", "CAPABILITIES"]]
    for row in rows:
        table.append(
            [
                str(row["id"]),
                str(row["distribution"]),
                str(row["version"]),
                str(row["status"]),
                ",".join(row["devices"]),
                ",".join(row["dtypes"]),
                ",".join(row["capabilities"]),
            ]
        )
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    for line in table:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        )
    for row in rows:
        if row["params"]:
            print(_params_line(str(row["id"]), row["params"]))
        missing = [e["requirement"] for e in row["extras"] if not e["installed"]]
        if missing:
            print(f"  {row['id']}: optional extras not installed: {_pip_install(missing)}")
        for need in row["missing_programs"]:
            print(f"  {row['id']}: {_missing_line(need)}")
        if row["parallel_domains"]:
            print(f"  {row['id']}: splits across ranks: {', '.join(row['parallel_domains'])}")
        if row["error"]:
            print(f"  {row['id']} ({row['status']}): {str(row['error']).splitlines()[0]}")
    return 0


def _params_line(engine_id: str, params: list[dict[str, object]]) -> str:
    """``  ENGINE: params: name=default, name, ...`` (a name alone: no default), wrapped to 100
    columns; each value as ``--param NAME=VALUE`` takes it. ``--json`` has their types and
    ranges."""
    shown = []
    for param in params:
        default = param["default"]
        if default is None:
            shown.append(str(param["name"]))
        else:
            text = str(default).lower() if isinstance(default, bool) else str(default)
            shown.append(f"{param['name']}={text}")
    return textwrap.fill(
        ", ".join(shown),
        width=100,
        initial_indent=f"  {engine_id}: params: ",
        subsequent_indent="    ",
        break_on_hyphens=False,
    )


def _pip_install(requirements: list[str]) -> str:
    """The command that installs ``requirements``, quoted for a shell (``'librosa>=0.10'``)."""
    return "pip install " + " ".join(shlex.quote(r) for r in requirements)


@contextlib.contextmanager
def _failures_in_table() -> Iterator[None]:
    """Drop discovery's log line for a failed plugin while the listing shows that failure itself."""

    def shown_elsewhere(entry: logging.LogRecord) -> bool:
        return not hasattr(entry, "engine_record")

    logger = logging.getLogger(discovery.__name__)
    logger.addFilter(shown_elsewhere)
    try:
        yield
    finally:
        logger.removeFilter(shown_elsewhere)


def _nothing_listed() -> str:
    """Why no engine is listed: none installed, or ``MIZUOTO_PLUGINS`` selected none of them."""
    selection = os.environ.get(SELECTION_VARIABLE)
    none = f"no engines installed (plugins register under the {ENTRY_POINT_GROUP!r} entry point)"
    if selection is None:
        return none
    entries = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    installed = sorted({ep.dist.name for ep in entries if ep.dist is not None})
    if not installed:
        return f"{none}; {SELECTION_VARIABLE} is set to {selection!r}"
    return (
        f"no engines listed: {SELECTION_VARIABLE}={selection!r} selects none of the installed "
        f"engine distributions ({', '.join(installed)}); name some of them, or unset "
        f"{SELECTION_VARIABLE} to load all"
    )


def doctor(args: argparse.Namespace) -> int:
    """Exit 1 when an engine checked (the one named, or any without a name) cannot run here.

    Here is the running server when server.json names one (its report, through its API), else
    this process; a line (stderr with ``--json``) says which. An embedding process's own host
    (``main(argv, service=...)``) reports on itself. A torch build that does not match the
    machine is reported with the command that replaces it, but does not fail the command by
    itself: engines still run on the CPU.
    """
    if args.service is not None:
        return _show_doctor(args.service.doctor(args.engine), args.json)
    from mizuoto_sdk.server.client import ServerError, ServerUnreachable, find_server

    client, where = find_server()
    say(where, args.json)
    if client is None:
        return _show_doctor(doctor_report(Discovery(), args.engine), args.json)
    path = "/api/v1/runtime/doctor"
    if args.engine is not None:
        path = f"/api/v1/engines/{urllib.parse.quote(args.engine, safe='')}/doctor"
    try:
        report = client.get(path, timeout=120.0)  # the server imports each implementation
    except (ServerError, ServerUnreachable) as error:
        return server_failure(error)
    return _show_doctor(cast("DoctorReport", report), args.json)


def _show_doctor(report: DoctorReport, as_json: bool) -> int:
    from mizuoto_sdk.host.notorch import TORCH_INSTALL

    build, diagnoses = report["torch"], report["engines"]
    if as_json:
        print(json.dumps(report, indent=2))
    else:
        if not build["installed"]:
            print(f"torch: not installed; engines that use torch need it: {TORCH_INSTALL}")
        else:
            print(f"torch: {build['version']}, built for {build['build']}")
        accelerators = ", ".join(build["accelerators"]) or "none"
        print(f"machine accelerators: {accelerators}")
        if build["install"]:
            if build["installed"]:
                print(f"  the installed torch does not match this machine: {_mismatch(build)}")
                print(f"  replace it: {build['install']}")
            else:
                print(f"  the torch build for this machine: {build['install']}")
        for engine in diagnoses:
            problems = _problems(engine, TORCH_INSTALL)
            if not problems:
                print(f"engine {engine['id']}: available")
            elif len(problems) == 1:
                print(f"engine {engine['id']}: {problems[0]}")
            else:
                print(f"engine {engine['id']}: cannot run")
                for problem in problems:
                    print(f"  - {problem}")
            for warning in engine["warnings"]:
                print(f"  warning: {warning}")
    return 0 if all(e["available"] for e in diagnoses) else 1


def _mismatch(build: TorchBuild) -> str:
    built = build["build"] or "cpu"
    if not build["accelerators"]:
        return (
            f"it is built for {built} but this machine has no GPU, so it runs on the CPU and "
            "carries GPU libraries it cannot use"
        )
    return f"it is built for {built} but this machine has {', '.join(build['accelerators'])}"


def _missing_line(need: Missing) -> str:
    return f"needs {need['kind']} {need['name']} ({need['reason']}): {need['install']}"


def _problems(engine: Diagnosis, torch_install: str) -> list[str]:
    """Why ``engine`` cannot run, one sentence with its fix each; empty when it can."""
    if engine["available"]:
        return []
    if engine["status"] != "ok":
        return [f"{engine['status']}: {str(engine['error']).splitlines()[0]}"]
    problems = [_missing_line(need) for need in engine["missing_programs"]]
    if engine["missing_extras"]:
        problems.append(f"lacks extras: {_pip_install(engine['missing_extras'])}")
    return problems or [f"needs torch: {torch_install}"]  # what else it lacks: torch
