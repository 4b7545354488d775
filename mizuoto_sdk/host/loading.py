"""What loading a model involves besides the engine's own ``load``: where the model's files
are, what the memory manager files its components under, and its components as ModelHandles."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING

from mizuoto_sdk.host.models import ModelStore, model_cache
from mizuoto_sdk.manifest import ModelEntry
from mizuoto_sdk.types import LoadSpec

if TYPE_CHECKING:
    from mizuoto_runtime.memory.handle import ModelHandle
    from mizuoto_sdk.engine import LoadedEngine


def model_handles(
    loaded: LoadedEngine, engine_id: str, uses_torch: bool, spec: LoadSpec
) -> tuple[ModelHandle, ...]:
    """``loaded.handles`` as ModelHandles: a plain nn.Module is wrapped in one.

    A wrapped module keeps the device its weights are on (its load device), named
    ``<engine>/<model>:<class name>``; anything else in ``handles`` is an engine bug, and so is
    any handle of an engine that declares ``uses_torch=False``.
    """
    items = tuple(loaded.handles)
    if not items:
        return ()
    if not uses_torch:
        raise TypeError(
            f"{type(loaded).__name__}.handles lists {len(items)} item(s), but engine "
            f"{engine_id!r} declares uses_torch=False; declare uses_torch=True"
        )
    from torch import nn

    from mizuoto_runtime.memory.handle import ModelHandle

    handles: list[ModelHandle] = []
    for index, item in enumerate(items):
        if isinstance(item, ModelHandle):
            handles.append(item)
            continue
        if not isinstance(item, nn.Module):
            raise TypeError(
                f"{type(loaded).__name__}.handles[{index}] is {type(item).__name__}"
                ", expected a mizuoto_runtime.memory.handle.ModelHandle or a torch.nn.Module"
            )
        name = f"{engine_id}/{spec.model_id}:{type(item).__name__}"
        if any(h.name == name for h in handles):
            name = f"{name}.{index}"
        tensor = next(itertools.chain(item.parameters(), item.buffers()), None)
        device = spec.device if tensor is None else str(tensor.device)
        handles.append(ModelHandle(item, name=name, load_device=device))
    return tuple(handles)


def owner_name(name: str, key: tuple[object, ...]) -> str:
    """``name`` with what else tells one load of the model from another (dtype, variant,
    options, a local model folder): ``"codeclm/tiny@cpu[float32]"``,
    ``"codeclm/tiny@cpu[bfloat16 {"x": 1}]"``."""
    _, variant, dtype, options, *rest = key
    extra = [str(dtype)] + ([f"variant={variant}"] if variant else [])
    extra += [f"model_dir={folder}" for folder in rest if folder is not None]
    return f"{name}[{' '.join(extra + ([str(options)] if options != '{}' else []))}]"


def model_dir(
    entry: ModelEntry, engine_id: str, cache: Path | None = None, local: Path | None = None
) -> Path | None:
    """The folder ``entry``'s files are in, checked: ModelNotInstalled (naming the command that
    installs it) when they are missing or damaged; ``cache`` is the model cache (default: the
    one ``MIZUOTO_HOME`` or the user data folder names); ``local`` a folder of the user's
    (``engines.<id>.model_dir``) that replaces the declared source."""
    store = ModelStore(cache if cache is not None else model_cache())
    return store.require(engine_id, entry, local)
