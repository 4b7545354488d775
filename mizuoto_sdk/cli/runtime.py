"""``mizuoto runtime``: the models loaded in this process and where their weights are."""

from __future__ import annotations

import argparse
import json

from mizuoto_sdk.cli.common import Usage, mib
from mizuoto_sdk.cli.settings import add_set_option, host_settings


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runtime_ = commands.add_parser(
        "runtime", help="models loaded in this process, and where their weights are"
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

    if args.service is None:
        service = RuntimeService(settings=host_settings(args.set))
    else:  # an embedding process's host: --set changes its settings
        from mizuoto_sdk.host.sources import parse_override

        service = args.service
        for override in args.set:
            service.settings.set(*parse_override(override))
    for target in args.load:
        engine_id, _, model = target.partition(":")
        service.load(engine_id, model or None, device=args.device)
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
        print(
            f"{model['name']} ({model['dtype']}): {model['state']}, "
            f"{mib(model['resident_bytes'])} resident, {mib(model['streamed_bytes'])} streamed, "
            f"{mib(model['host_bytes'])} in host memory"
        )
        for part in model["components"]:
            print(
                f"  {part['name']}: {part['state']}, {mib(part['resident_bytes'])} resident, "
                f"{mib(part['streamed_bytes'])} streamed, {mib(part['host_bytes'])} host"
            )
    return 0
