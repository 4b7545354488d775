"""``mizuoto runtime``: the models this process serves: where their weights are, or (served by
worker processes) each replica and its workers."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from mizuoto_sdk.cli.common import Usage, mib
from mizuoto_sdk.cli.settings import add_set_option, host_settings

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runtime_ = commands.add_parser(
        "runtime",
        help="models loaded in this process, where their weights are, and their replicas",
    )
    runtime_.add_argument(
        "--json", action="store_true", help="print the models as JSON; default: lines"
    )
    runtime_.add_argument(
        "--load",
        action="append",
        default=[],
        metavar="ENGINE[:MODEL]",
        help="load this engine's model first (MODEL: a model id; default: the engine's model "
        "setting, else its first model); repeatable; default: load nothing",
    )
    runtime_.add_argument(
        "--unload",
        nargs="?",
        const="",
        metavar="MODEL",
        help="unload idle models: all (no MODEL), or one engine id or model name as listed; "
        "default: unload nothing",
    )
    runtime_.add_argument(
        "--device",
        help="device for --load (cpu, cuda, cuda:1, ...); default: the engine's device setting, "
        "else cpu",
    )
    add_set_option(runtime_)
    runtime_.set_defaults(handler=runtime)


def runtime(args: argparse.Namespace) -> int:
    from mizuoto_sdk.host import RuntimeService

    if args.service is not None:  # an embedding process's host: --set changes its settings
        from mizuoto_sdk.host.sources import parse_override

        for override in args.set:
            args.service.settings.set(*parse_override(override))
        return _run(args, args.service)
    with RuntimeService(settings=host_settings(args.set)) as service:  # no worker outlives it
        return _run(args, service)


def _run(args: argparse.Namespace, service: RuntimeService) -> int:
    for target in args.load:
        engine_id, _, model = target.partition(":")
        # started now, so that a model served by worker processes shows their pids
        service.load(engine_id, model or None, device=args.device).start()
    if args.unload is not None:
        known = {m["name"] for m in service.describe_models()} | {
            e.engine_id for e in service.engines()
        }
        if args.unload and args.unload not in known:
            raise Usage(f"--unload: no loaded model or engine {args.unload!r}")
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
        if model["mode"] == "inline":
            print(
                f"{model['name']} ({model['dtype']}): {model['state']}, "
                f"{mib(model['resident_bytes'])} resident, {mib(model['streamed_bytes'])} "
                f"streamed, {mib(model['host_bytes'])} in host memory, inline"
            )
        else:  # the workers hold the weights: their memory is theirs to report
            count = len(model["replicas"])
            dtype = f" ({model['dtype']})" if model["dtype"] else ""  # None until a worker says
            print(
                f"{model['name']}{dtype}: {model['state']}, {model['mode']}, "
                f"{count} replica{'' if count == 1 else 's'}"
            )
            for replica in model["replicas"]:
                print(f"  {_replica_line(replica)}")
        for part in model["components"]:
            print(
                f"  {part['name']}: {part['state']}, {mib(part['resident_bytes'])} resident, "
                f"{mib(part['streamed_bytes'])} streamed, {mib(part['host_bytes'])} host"
            )
    return 0


def _replica_line(replica: dict[str, Any]) -> str:
    """``replica 0: ready, healthy, 0 in flight, on cpu, pids 4242`` (and why it failed)."""
    pids = ", ".join(str(pid) for pid in replica["pids"]) or "none"
    line = (
        f"replica {replica['id']}: {replica['state']}, "
        f"{'healthy' if replica['healthy'] else 'unhealthy'}, {replica['in_flight']} in flight, "
        f"on {', '.join(replica['devices'])}, pid{'s' if len(replica['pids']) > 1 else ''} {pids}"
    )
    return line if replica["failure"] is None else f"{line}, failed: {replica['failure']}"
