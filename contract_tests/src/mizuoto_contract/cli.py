"""``mizuoto-contract ENGINE_OR_DISTRIBUTION... [--device D] [--check ID]... [--text TEXT]
[--examples N] [--jobs N] [--check-timeout SECONDS] [--fail-fast] [--list] [--json FILE]
[--junit FILE]`` (also
``python -m mizuoto_contract``).

Each check's result is printed as it ends, a failure with its rule, what was expected and seen,
the engine's own file:line, and the fix. Exit 0 when every check passed, xfailed, or was skipped
for a capability the engine lacks; 1 on any failure, unexpected pass, or check skipped for any
other reason; 2 for a usage mistake.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from mizuoto_contract.inputs import DEFAULT_EXAMPLES
from mizuoto_contract.registry import STATUSES, CheckResult
from mizuoto_contract.watchdog import DEFAULT_CHECK_TIMEOUT

_WIDTH = 34


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mizuoto-contract", description="Check a Mizuoto engine against the contract."
    )
    parser.add_argument("targets", nargs="*", metavar="ENGINE_OR_DISTRIBUTION")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--check", action="append", dest="checks", metavar="ID")
    parser.add_argument(
        "--text", default=None, help="what the checks speak (default: three sentences)"
    )
    parser.add_argument(
        "--examples",
        type=_examples,
        default=DEFAULT_EXAMPLES,
        metavar="N",
        help="seeds tried per explored property, each with a short text by turns; a failure is "
        "shrunk to the smallest failing seed found. Raise it for a deeper search "
        f"(--examples 200) (default: {DEFAULT_EXAMPLES})",
    )
    parser.add_argument(
        "--jobs",
        type=_jobs,
        default=None,
        metavar="N",
        help="processes that run checks at once: 2 runs the costliest checks and the fresh "
        "process beside the rest, each process with cores/2 torch threads (OMP_NUM_THREADS, "
        "unless set); 1 runs them one after another with torch's own thread count "
        "(default: 2 where two cores are free, else 1)",
    )
    parser.add_argument(
        "--check-timeout",
        type=float,
        default=DEFAULT_CHECK_TIMEOUT,
        metavar="SECONDS",
        help="fail a check that runs longer, with every thread's stack, and go on with the next "
        f"(default: {DEFAULT_CHECK_TIMEOUT:g})",
    )
    parser.add_argument(
        "--fail-fast", action="store_true", help="stop at the first result that fails the run"
    )
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    parser.add_argument("--json", type=Path, metavar="FILE")
    parser.add_argument("--junit", type=Path, metavar="FILE")
    return parser


def _examples(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {value!r}")
    return number


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if jobs not in (1, 2):
        raise argparse.ArgumentTypeError(f"expected 1 or 2, got {value!r}")
    return jobs


def _threads(jobs: int) -> None:
    """Give each of the run's ``jobs`` processes its share of the cores, before torch loads in
    this process or in the fork server (the one change to its own environment this command
    makes; a value the user set wins). Every thread of every process then agrees, so that two
    processes computing at once do not spin against each other, and a take made here is
    compared with takes made with the same thread count."""
    from mizuoto_contract.beside import threads_for

    if jobs > 1 and "OMP_NUM_THREADS" not in os.environ:
        os.environ["OMP_NUM_THREADS"] = str(threads_for(jobs))


def totals(results: Sequence[CheckResult]) -> dict[str, int]:
    counts = {status: sum(r.status == status for r in results) for status in STATUSES}
    counts["ran"] = len(results) - counts["skipped"]
    counts["skipped_capability"] = sum(r.status == "skipped" and r.capability_skip for r in results)
    counts["bad"] = sum(r.bad for r in results)
    return counts


def _list() -> int:
    from mizuoto_contract.checks import ALL

    width = max(len(c.id) for c in ALL)
    for check in ALL:
        print(f"{check.id:<{width}}  {check.tier:<9}  {check.rule}")
    return 0


def _print_result(result: CheckResult) -> None:
    """One line per check as it ends; a failure's full report right below it."""
    first = result.message.splitlines()[0] if result.message else ""
    print(f"  {result.status:<8} {result.id:<{_WIDTH}}  {first}".rstrip(), flush=True)
    if result.status in ("failed", "xpass"):
        print(f"\n    [{result.id}] {result.rule}")
        for line in result.message.splitlines():
            print(f"      {line}")
        print(flush=True)


def _junit(runs: list[tuple[str, str, list[CheckResult]]], path: Path) -> None:
    suites = ET.Element("testsuites")
    for engine, device, results in runs:
        counts = totals(results)
        suite = ET.SubElement(
            suites,
            "testsuite",
            name=f"{engine}[{device}]",
            tests=str(len(results)),
            failures=str(counts["bad"]),
            skipped=str(counts["skipped"] + counts["xfail"]),
        )
        for result in results:
            case = ET.SubElement(
                suite, "testcase", classname=engine, name=result.id, time=f"{result.seconds:.3f}"
            )
            if result.bad:
                ET.SubElement(case, "failure", message=result.rule).text = result.message
            elif result.status in ("skipped", "xfail"):
                ET.SubElement(case, "skipped", message=result.message)
    ET.ElementTree(suites).write(path, encoding="unicode", xml_declaration=True)


def run() -> None:
    """The ``mizuoto-contract`` executable: ``main`` on ``sys.argv``, then the process ends with
    its code; signals and a reader that stops reading end it cleanly (``mizuoto_sdk.process``)."""
    from mizuoto_sdk.process import run_command

    run_command(main, "mizuoto-contract")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.list:
        return _list()
    if not args.targets:
        print(
            "mizuoto-contract: error: name an engine or a distribution (or use --list)",
            file=sys.stderr,
        )
        return 2
    from mizuoto_contract.beside import default_jobs
    from mizuoto_contract.outcome import ContractUsageError
    from mizuoto_contract.runner import checks_by_id, engines_for, run_contract

    jobs = default_jobs() if args.jobs is None else args.jobs
    _threads(jobs)
    from mizuoto_sdk.host import Discovery

    discovery = Discovery()
    runs: list[tuple[str, str, list[CheckResult]]] = []
    try:
        checks_by_id(args.checks)
        engines = [e for target in args.targets for e in engines_for(target, discovery)]
        for engine in engines:
            print(f"\n{engine} on {args.device}", flush=True)
            results = run_contract(
                engine,
                args.device,
                args.checks,
                discovery,
                text=args.text,
                examples=args.examples,
                on_result=_print_result,
                fail_fast=args.fail_fast,
                check_timeout=args.check_timeout,
                jobs=jobs,
            )
            runs.append((engine, args.device, results))
            if args.fail_fast and any(r.bad for r in results):
                break
    except ContractUsageError as error:
        print(f"mizuoto-contract: error: {error}", file=sys.stderr)
        return 2
    everything = [r for _, _, results in runs for r in results]
    counts = totals(everything)
    print(
        f"\n{counts['passed']} passed, {counts['failed']} failed, {counts['xfail']} xfailed, "
        f"{counts['xpass']} xpassed, {counts['skipped']} skipped "
        f"({counts['skipped_capability']} for a missing capability); {counts['ran']} ran"
    )
    if args.json:
        report = {
            "engines": [
                {"engine": e, "device": d, "checks": [r.to_dict() for r in rs]} for e, d, rs in runs
            ],
            "totals": {k: counts[k] for k in ("ran", *STATUSES, "skipped_capability")},
        }
        args.json.write_text(json.dumps(report, indent=2))
    if args.junit:
        _junit(runs, args.junit)
    return 1 if counts["bad"] else 0


if __name__ == "__main__":
    sys.exit(main())
