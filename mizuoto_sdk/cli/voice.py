"""``mizuoto voice prepare``: a recording into a voice folder that ``synth --voice`` takes."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from mizuoto_sdk.cli.common import add_call_options, request_params
from mizuoto_sdk.cli.output import applied_record
from mizuoto_sdk.cli.progress import Progress
from mizuoto_sdk.cli.settings import add_set_option, host_settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    voice_ = commands.add_parser("voice", help="prepare voices for engines that clone them")
    actions = voice_.add_subparsers(dest="action", required=True, metavar="ACTION")
    prepare = actions.add_parser(
        "prepare", help="turn a recording into a voice folder (`synth --voice DIR`)"
    )
    prepare.add_argument("engine", metavar="ENGINE", help="an engine id (`mizuoto engines`)")
    prepare.add_argument(
        "audio",
        type=Path,
        metavar="AUDIO",
        help="a recording of the voice: 8/16/24/32-bit PCM or float WAV, any channels",
    )
    prepare.add_argument(
        "-o",
        "--output",
        required=True,
        type=Path,
        metavar="DIR",
        help="the voice folder to create; it must not exist or be empty, and appears only when "
        "the engine succeeds; required",
    )
    add_call_options(prepare)
    add_set_option(prepare)
    prepare.set_defaults(handler=prepare_voice)


def prepare_voice(args: argparse.Namespace) -> int:
    from mizuoto_sdk.audio import read_wav
    from mizuoto_sdk.host import EngineRequest, RuntimeService

    recording = read_wav(args.audio)
    started = time.perf_counter()
    with RuntimeService(settings=host_settings(args.set)) as service:  # no worker outlives it
        manifest = service.discovery.manifest(args.engine)
        params = request_params(manifest, args.param, seed=args.seed)
        progress = Progress()
        try:
            handle = service.load(args.engine, args.model, device=args.device, dtype=args.dtype)
            handle.start()  # worker processes start now: their startup is part of the load
            load_seconds = time.perf_counter() - started
            progress.restart()
            request = EngineRequest(params=params, progress=progress)
            result = handle.prepare_voice(recording, args.output, request) or {}
        except BaseException:
            progress.abandon()
            raise
    progress.finish(f"voice {args.output}")
    timings = {"load": load_seconds, **request.timings}
    if args.json:
        record = {
            "engine": args.engine,
            "voice": str(args.output),
            "result": result,
            "timings": timings,
            "applied": applied_record(manifest, request),
            "warnings": request.warnings,
        }
        print(json.dumps(record, default=str))
        return 0
    files = result.get("files")
    listed = f" ({', '.join(map(str, files))})" if isinstance(files, list) else ""
    print(f"wrote voice {args.output}{listed} in {timings.get('total', 0):.2f} s")
    for warning in request.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    if any(p.name == "voice" for p in manifest.params):
        print(f'use it: mizuoto synth {args.engine} "..." --voice {args.output} -o out.wav')
    return 0
