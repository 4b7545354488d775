"""``mizuoto runtime``: the models the running server (found through server.json) or, without
one, this process serves: where their weights are, or (served by worker processes) each replica
and its workers."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING, Any

from mizuoto_sdk.cli.common import Usage, mib, say, server_failure
from mizuoto_sdk.cli.settings import add_set_option, host_settings

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.server.client import ServerClient


LOAD_TIMEOUT = 900.0
"""Seconds ``--load`` waits for a server to load a model (reading large weights takes minutes)."""


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    runtime_ = commands.add_parser(
        "runtime",
        help="models loaded in the running server (else in this process), where their weights "
        "are, and their replicas",
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
    """The models of the running server when server.json names one (``--load``, ``--unload``
    through its API), else of this process; a line (stderr with ``--json``) says which.

    An embedding process's own host (``main(argv, service=...)``) is always the one shown.
    """
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.server.client import ServerError, ServerUnreachable, find_server

    if args.service is not None:  # an embedding process's host: --set changes its settings
        from mizuoto_sdk.host.sources import parse_override

        for override in args.set:
            args.service.settings.set(*parse_override(override))
        return _run(args, args.service)
    client, where = find_server()
    if client is not None:
        if args.set:
            raise Usage(
                f"--set: the {where} keeps its own settings; change them in its settings file "
                "and restart it, or stop it to run this command's own host with --set"
            )
        say(where, args.json)
        try:
            return _run_on_server(args, client)
        except (ServerError, ServerUnreachable) as error:
            return server_failure(error)
    say(where, args.json)
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
    return _show(service.describe_models(), args.json, "in this process")


def _run_on_server(args: argparse.Namespace, client: ServerClient) -> int:
    """``_run`` through the server's API: the same requests, the same lines."""
    for target in args.load:
        engine_id, _, model = target.partition(":")
        body = {"engine": engine_id, "model": model or None, "device": args.device}
        client.post("/api/v1/runtime/load", body, timeout=LOAD_TIMEOUT)
    if args.unload is not None:
        answer = client.post("/api/v1/runtime/unload", {"model": args.unload or None})
        unloaded = answer.get("unloaded", []) if isinstance(answer, dict) else []
        if not args.json:
            print(f"unloaded: {', '.join(unloaded) or 'nothing idle'}")
    runtime_ = client.get("/api/v1/runtime")
    models = runtime_.get("models", []) if isinstance(runtime_, dict) else []
    return _show(models, args.json, "in the server")


def _show(models: list[dict[str, Any]], as_json: bool, where: str) -> int:
    if as_json:
        print(json.dumps(models, indent=2, default=str))
        return 0
    if not models:
        print(f"no models loaded {where}")
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
