"""The ``mizuoto`` command. Listing, doctor and runtime never import torch; synth does, to load.

Exit codes: 0 ok, 2 a usage mistake (bad arguments, unknown engine, empty text, unwritable
output), 1 an engine error, printed with its code. Stopped by SIGINT or SIGTERM, the command
cleans up, prints one line and ends by that signal.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from mizuoto_sdk.discovery import Discovery, EngineRecord
from mizuoto_sdk.errors import EngineError
from mizuoto_sdk.process import run_command

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService

USAGE_CODES = {"engine_not_found", "invalid_request", "capability_not_supported"}


class _Usage(Exception):
    """A mistake in how the command was called: printed, exit 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mizuoto", description="Run Mizuoto speech engines.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    engines = commands.add_parser("engines", help="list installed engines")
    engines.add_argument("--json", action="store_true", help="print JSON")

    synth = commands.add_parser("synth", help="synthesize TEXT into a WAV file")
    synth.add_argument("engine", metavar="ENGINE")
    synth.add_argument("text", metavar="TEXT")
    synth.add_argument("-o", "--output", required=True, type=Path, metavar="OUT.wav")
    synth.add_argument("--seed", type=int)
    synth.add_argument("--device")
    synth.add_argument("--dtype")
    synth.add_argument("--model")

    doctor = commands.add_parser("doctor", help="check torch and the engines' requirements")
    doctor.add_argument("engine", nargs="?", metavar="ENGINE")
    doctor.add_argument("--json", action="store_true", help="print JSON")

    runtime = commands.add_parser(
        "runtime", help="models loaded in this process, and where their weights are"
    )
    runtime.add_argument("--json", action="store_true", help="print JSON")
    runtime.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="ENGINE[:MODEL]",
        help="load this engine's model first (repeatable)",
    )
    runtime.add_argument(
        "--unload",
        nargs="?",
        const="",
        metavar="MODEL",
        help="unload idle models: all, or one engine or model as listed",
    )
    runtime.add_argument("--device", help="device for --load")
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
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exit_:  # argparse has printed the usage message
        return int(exit_.code or 0)
    command = {"engines": _engines, "synth": _synth, "doctor": _doctor, "runtime": _runtime}
    args.service = service
    try:
        return command[args.command](args)
    except _Usage as error:
        print(f"mizuoto: error: {error}", file=sys.stderr)
        return 2
    except EngineError as error:
        print(f"mizuoto: error [{error.code}]: {error}", file=sys.stderr)
        return 2 if error.code in USAGE_CODES else 1
    except SystemExit as exit_:  # engine or plugin code ended the command: say so, never silently
        print(
            f"mizuoto: error: engine or plugin code called sys.exit({exit_.code!r})",
            file=sys.stderr,
        )
        return 1


_Extra = TypedDict("_Extra", {"import": str, "requirement": str, "installed": bool})


class _Row(TypedDict):
    id: str
    name: str | None
    distribution: str
    version: str
    status: str
    devices: list[str]
    dtypes: list[str]
    capabilities: list[str]
    models: list[str]
    extras: list[_Extra]
    params: list[dict[str, object]]
    api_version: str | None
    uses_torch: bool | None
    entry_point: str
    error: str | None


class _Diagnosis(TypedDict):
    id: str
    status: str
    available: bool
    missing_extras: list[str]
    error: str | None
    warnings: list[str]


def _extras(record: EngineRecord) -> list[_Extra]:
    extras = record.manifest.extras if record.manifest else {}
    return [
        {"import": name, "requirement": requirement, "installed": _importable(name)}
        for name, requirement in extras.items()
    ]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _row(record: EngineRecord) -> _Row:
    manifest = record.manifest
    return {
        "id": record.id,
        "name": manifest.name if manifest else None,
        "distribution": record.distribution,
        "version": record.version,
        "status": record.status,
        "devices": list(manifest.devices) if manifest else [],
        "dtypes": list(manifest.dtypes) if manifest else [],
        "capabilities": list(manifest.capabilities) if manifest else [],
        "models": [m.id for m in manifest.models] if manifest else [],
        "extras": _extras(record),
        "params": [param.describe() for param in manifest.params] if manifest else [],
        "api_version": manifest.api_version if manifest else None,
        "uses_torch": manifest.uses_torch if manifest else None,
        "entry_point": record.entry_point,
        "error": record.error,
    }


def _engines(args: argparse.Namespace) -> int:
    rows = [_row(r) for r in Discovery().records()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print("no engines installed (plugins register under the 'mizuoto.engines' entry point)")
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
        missing = [e["requirement"] for e in row["extras"] if not e["installed"]]
        if missing:
            print(f"  {row['id']}: optional extras not installed: pip install {' '.join(missing)}")
        if row["error"]:
            print(f"  {row['id']} ({row['status']}): {str(row['error']).splitlines()[0]}")
    return 0


class _Progress:
    """Progress lines on stderr, only once a run has taken longer than ``delay`` seconds."""

    def __init__(self, delay: float = 0.5, every: float = 0.25) -> None:
        self._start = time.perf_counter()
        self._delay, self._every, self._last = delay, every, 0.0

    def __call__(self, done: float, total: float | None, message: str | None) -> None:
        now = time.perf_counter() - self._start
        if now < self._delay or now - self._last < self._every:
            return
        self._last = now
        amount = f"{done:g}/{total:g}" if total else f"{done:g}"
        print(
            f"progress {amount}{f' {message}' if message else ''} ({now:.1f} s)",
            file=sys.stderr,
            flush=True,
        )


def _synth(args: argparse.Namespace) -> int:
    from mizuoto_sdk.audio import AtomicFile, write_wav
    from mizuoto_sdk.host import EngineRequest, RuntimeService

    if not args.text.strip():
        raise _Usage("TEXT is empty: give the words to synthesize")
    try:
        is_folder = args.output.is_dir()
    except OSError as error:  # a name too long for the file system, a loop of links ...
        raise _Usage(f"cannot write {args.output}: {error.strerror or error}") from None
    if is_folder:
        raise _Usage(f"-o {args.output} is a folder; give a file name such as out.wav")
    started = time.perf_counter()
    service = RuntimeService()
    engine = service.engine(args.engine, args.device)
    try:
        output = AtomicFile(args.output)
    except OSError as error:
        raise _Usage(f"cannot write {args.output}: {error.strerror or error}") from None
    with output as temporary:
        handle = engine.load(args.model, dtype=args.dtype)
        loaded = time.perf_counter()
        request = EngineRequest(
            params={} if args.seed is None else {"seed": args.seed}, progress=_Progress()
        )
        chunks = list(handle.synthesize(args.text, request))
        if not chunks:
            raise EngineError(f"engine {args.engine!r} produced no audio for {args.text!r}")
        import numpy as np

        samples, rate = np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate
        write_wav(temporary, samples, rate)
    timings = request.timings
    print(
        f"wrote {args.output}: {len(samples) / rate:.2f} s of audio at {rate} Hz in "
        f"{len(chunks)} chunks (seed {request.applied.get('seed')})"
    )
    print(
        f"timings: load {loaded - started:.3f} s, first chunk {timings.get('first_chunk', 0):.3f}"
        f" s, synthesis {timings.get('total', 0):.3f} s"
    )
    return 0


def _doctor(args: argparse.Namespace) -> int:
    from mizuoto_runtime.devices.probe import torch_build
    from mizuoto_sdk.host.notorch import TORCH_INSTALL

    build = torch_build()
    discovery = Discovery()
    records = discovery.records()
    if args.engine is not None:
        records = tuple(r for r in records if r.id == args.engine)
        if not records:
            known = ", ".join(sorted({r.id for r in discovery.records()}))
            raise EngineError(
                f"no engine {args.engine!r}; known engines: {known}", code="engine_not_found"
            )
    engines = [_diagnose(discovery, r, bool(build["installed"])) for r in records]
    if args.json:
        print(json.dumps({"torch": build, "engines": engines}, indent=2))
    else:
        if not build["installed"]:
            print(f"torch: not installed; engines that use torch need it: {TORCH_INSTALL}")
        else:
            print(f"torch: {build['version']}, built for {build['build']}")
        accelerators = ", ".join(build["accelerators"]) or "none"
        print(f"machine accelerators: {accelerators}")
        if build["install"]:
            if build["installed"]:
                print(f"  the installed torch does not match this machine: {build['install']}")
            else:
                print(f"  the torch build for this machine: {build['install']}")
        for engine in engines:
            if engine["available"]:
                state = "available"
            elif engine["status"] != "ok":
                state = f"{engine['status']}: {str(engine['error']).splitlines()[0]}"
            elif not engine["missing_extras"]:  # what else it lacks: torch
                state = f"needs torch: {TORCH_INSTALL}"
            else:
                state = f"lacks extras: pip install {' '.join(engine['missing_extras'])}"
            print(f"engine {engine['id']}: {state}")
            for warning in engine["warnings"]:
                print(f"  warning: {warning}")
    return 0 if all(e["status"] == "ok" for e in engines) else 1


def _diagnose(discovery: Discovery, record: EngineRecord, torch: bool) -> _Diagnosis:
    """One engine's doctor entry, after importing its implementation as ``synth`` would.

    A misspelt class, an import that fails or exits, or a class that disagrees with its manifest
    shows here with status ``unavailable`` and the reason, rather than as "available".

    Importing it must not import torch (listing and doctor stay fast and torch-free); when it
    does, that is a warning. Once torch is in this process, later engines cannot be judged on
    this point: ``mizuoto doctor ENGINE`` checks one engine in a fresh process. An engine that
    uses torch is unavailable where torch is not installed (``torch`` False).
    """
    status: str = record.status
    error = record.error
    warnings: list[str] = []
    if record.ok:
        torch_before = "torch" in sys.modules
        try:
            discovery.get_engine(record.id)
        except EngineError as unavailable:
            status, error = "unavailable", str(unavailable)
        else:
            if not torch_before and "torch" in sys.modules:
                implementation = record.manifest.implementation if record.manifest else record.id
                warnings.append(
                    f"importing {implementation} imports torch, which makes listing and doctor "
                    "slow; import torch inside load() instead"
                )
    missing = [e["requirement"] for e in _extras(record) if not e["installed"]]
    uses_torch = record.manifest.uses_torch if record.manifest else None
    return {
        "id": record.id,
        "status": status,
        "available": status == "ok" and not missing and (torch or uses_torch is False),
        "missing_extras": missing,
        "error": error,
        "warnings": warnings,
    }


def _runtime(args: argparse.Namespace) -> int:
    from mizuoto_sdk.host import RuntimeService

    service = args.service if args.service is not None else RuntimeService()
    for target in args.load:
        engine_id, _, model = target.partition(":")
        service.load(engine_id, model or None, device=args.device)
    if args.unload is not None:
        known = {m["name"] for m in service.describe_models()} | {
            e.engine_id for e in service.engines()
        }
        if args.unload and args.unload not in known:
            raise _Usage(f"--unload: no loaded model or engine {args.unload!r}")
        unloaded = service.unload(args.unload or None)
        if not args.json:
            print(f"unloaded: {', '.join(unloaded) or 'nothing idle'}")
    models = service.describe_models()
    if args.json:
        print(json.dumps(models, indent=2, default=str))
        return 0
    if not models:
        print("no models loaded in this process")
    for model in models:
        print(
            f"{model['name']} ({model['dtype']}): {model['state']}, "
            f"{_mib(model['resident_bytes'])} resident, {_mib(model['streamed_bytes'])} streamed, "
            f"{_mib(model['host_bytes'])} in host memory"
        )
        for part in model["components"]:
            print(
                f"  {part['name']}: {part['state']}, {_mib(part['resident_bytes'])} resident, "
                f"{_mib(part['streamed_bytes'])} streamed, {_mib(part['host_bytes'])} host"
            )
    return 0


def _mib(count: object) -> str:
    return f"{int(count) / 2**20:.1f} MiB"  # type: ignore[call-overload]  # a byte count


if __name__ == "__main__":
    run()
