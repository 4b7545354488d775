"""``mizuoto models``: each model's files (installed, missing, corrupt), pulling and removing them.

    mizuoto models [ENGINE] [--json] [--verify] [--set KEY=VALUE]
    mizuoto models pull ENGINE[:MODEL] [--json]
    mizuoto models rm ENGINE[:MODEL]

Never imports torch. The host's settings are the settings files' and ``--set``. MODEL defaults
to the engine's model setting, else its first model. The engine's current model shows as
``local`` with its folder where ``engines.<id>.model_dir`` is set.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from mizuoto_sdk.cli.common import Usage, mib
from mizuoto_sdk.cli.settings import add_set_option

if TYPE_CHECKING:
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.host.models import ModelStatus, ModelStore
    from mizuoto_sdk.manifest import ModelEntry


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    models = commands.add_parser(
        "models",
        help="model files: list them (installed, missing, corrupt), pull or rm one",
        description="List every model's files, or pull (fetch, verify, install) or rm one. "
        "Models are pulled into the setting models.cache (default: $MIZUOTO_HOME/models, "
        "MIZUOTO_HOME defaulting to the user data folder).",
    )
    models.add_argument(
        "words",
        nargs="*",
        metavar="[pull|rm] [ENGINE[:MODEL]]",
        help="nothing or ENGINE: list (default: every engine); pull ENGINE[:MODEL]; "
        "rm ENGINE[:MODEL] (MODEL default: the engine's model setting, else its first model)",
    )
    models.add_argument("--json", action="store_true", help="print JSON (default: a table)")
    models.add_argument(
        "--verify",
        action="store_true",
        help="listing: check every file's sha256 too (reads every byte; default: sizes only)",
    )
    add_set_option(models)
    models.set_defaults(handler=models_command)


def models_command(args: argparse.Namespace) -> int:
    from mizuoto_sdk.cli.settings import host_settings
    from mizuoto_sdk.host import RuntimeService
    from mizuoto_sdk.host.models import ModelStore, model_cache

    service: RuntimeService = (
        args.service if args.service is not None else RuntimeService(host_settings(args.set))
    )
    store = ModelStore(model_cache(service.settings))
    words = list(args.words)
    action = words.pop(0) if words and words[0] in ("pull", "rm") else "list"
    if len(words) > 1 or (action != "list" and not words):
        raise Usage(
            "models: expected 'models [ENGINE]', 'models pull ENGINE[:MODEL]' or "
            f"'models rm ENGINE[:MODEL]', got {' '.join(args.words)!r}"
        )
    if action == "list":
        return _list(service, store, words[0] if words else None, args)
    engine_id, entry = _target(service, words[0])
    if action == "rm":
        removed = store.remove(engine_id, entry)
        name = f"{engine_id}:{entry.id}"
        print(f"removed {name}" if removed else f"{name}: not pulled, nothing removed")
        return 0
    status = store.pull(engine_id, entry, _Progress(f"{engine_id}:{entry.id}", args.json))
    if args.json:
        print(json.dumps(status.to_dict(), indent=2))
    else:
        print(f"installed {engine_id}:{entry.id} ({mib(status.size)}) in {status.folder}")
    return 0


def _target(service: RuntimeService, target: str) -> tuple[str, ModelEntry]:
    engine_id, _, model = target.partition(":")
    manifest = service.discovery.manifest(engine_id)
    return engine_id, manifest.model(model or service.settings.engine(engine_id, "model"))


def _list(
    service: RuntimeService, store: ModelStore, engine: str | None, args: argparse.Namespace
) -> int:
    records = [r for r in service.discovery.records() if r.manifest is not None and r.ok]
    if engine is not None:
        records = [service.discovery.record(engine)]
    rows: list[ModelStatus] = [
        _status(service, store, record.id, entry, args.verify)
        for record in records
        for entry in (record.manifest.models if record.manifest else ())
    ]
    if args.json:
        print(json.dumps([row.to_dict() for row in rows], indent=2))
        return 0
    if not rows:
        print("no models")
    for row in rows:
        where = "" if row.folder is None else f"  {row.folder}"
        print(f"{row.engine}:{row.model}  {row.state}  {row.source}  {mib(row.size)}{where}")
        for problem in row.problems:
            print(f"  {problem}")
        if row.state != "installed" and row.pullable:
            print(f"  install: mizuoto models pull {row.engine}:{row.model}")
    return 0


def _status(
    service: RuntimeService, store: ModelStore, engine_id: str, entry: ModelEntry, verify: bool
) -> ModelStatus:
    """The engine's current model from the folder ``engines.<id>.model_dir`` names, if set."""
    from mizuoto_sdk.host.models import local_folder

    manifest = service.discovery.manifest(engine_id)
    folder = local_folder(service.settings, manifest, entry)
    if folder is not None:
        return store.local(engine_id, entry, folder)
    return store.status(engine_id, entry, verify=verify)


class _Progress:
    """On a terminal one line that updates; otherwise a line per file as it completes."""

    def __init__(self, name: str, quiet: bool) -> None:
        self.name, self.quiet = name, quiet
        self.terminal = sys.stderr.isatty()
        self.last = ""

    def __call__(self, path: str, done: int, total: int) -> None:
        if self.quiet:
            return
        if self.terminal:
            percent = 100 * done // total if total else 100
            line = f"\rpulling {self.name}: {mib(done)} of {mib(total)} ({percent}%) {path}"
            print(line, end="\n" if done >= total else "", file=sys.stderr, flush=True)
        elif path != self.last:
            if self.last:
                print(f"  {self.last}: done", file=sys.stderr)
            self.last = path
        if not self.terminal and done >= total and total:
            print(f"  {path}: done ({mib(total)} in all)", file=sys.stderr)
