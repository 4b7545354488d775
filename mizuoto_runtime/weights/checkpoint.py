"""Reading checkpoints: safetensors memory-mapped, pickles with ``weights_only=True``, sharded
indexes, and whole folders, each failure a ``CheckpointError`` that names the path.

Whatever a file holds, reading it ends in tensors or a ``CheckpointError``: a malformed file may
make torch or json fail in any way, and those failures are reported, never raised raw. Files that
a folder or an index names must resolve inside the model's trees (``weights/paths.py``), so a
link cannot make the reader open a file elsewhere. Reading checks the bound request's cancel
between shards and tensors.

Split from ``loading`` (which re-exports ``load_state_dict`` and ``CheckpointError``) so that
reading a file and fitting a state dict into a module stay one job each.
"""

from __future__ import annotations

import json
import pickle
import re
import zipfile
from collections.abc import Mapping
from os import PathLike
from pathlib import Path

import torch
from safetensors import safe_open
from torch import Tensor

from mizuoto_runtime.context import current_context
from mizuoto_runtime.weights.paths import allowed_trees, resolves_inside
from mizuoto_sdk.errors import EngineError, EngineUnavailable

__all__ = ["PICKLE_SUFFIXES", "CheckpointError", "load_state_dict"]

PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")
MAX_INDEX_BYTES = 64 * 2**20  # transformers' largest indexes are a few MiB

# Folder layouts in preference order: the first name, or else the only match of the patterns.
_FOLDER_LAYOUTS = (
    ("model.safetensors.index.json", "*.safetensors.index.json"),
    ("model.safetensors", "*.safetensors"),
    ("pytorch_model.bin.index.json", "*.bin.index.json"),
    ("pytorch_model.bin", "*.bin", "*.pt", "*.pth", "*.ckpt"),
)


class CheckpointError(EngineUnavailable, ValueError):
    """A checkpoint could not be read; the message names the path and what was expected there.

    An operator fixes it by replacing the file, so the host reports it as ``engine_unavailable``
    with ``detail["file"]``, not as an engine bug; ``ValueError`` stays a base for library code.
    """

    def __init__(self, path: str | PathLike[str], problem: str) -> None:
        super().__init__(
            f"{path}: {problem}", {"reason": "checkpoint_unreadable", "file": str(path)}
        )
        self.path = Path(path)
        self.problem = problem


def load_state_dict(
    path: str | PathLike[str], *, device: str | torch.device = "cpu", member: str | None = None
) -> dict[str, Tensor]:
    """Read the tensors of a checkpoint file or folder, onto ``device``.

    ``path`` is a ``.safetensors`` file, a pickle (``.pt``, ``.pth``, ``.bin``, ``.ckpt``) or a
    folder in transformers' layout: ``model.safetensors.index.json`` naming shards in
    ``weight_map``, or a single ``model.safetensors`` (then the ``.bin`` equivalents; any single
    ``*.safetensors`` also does). Safetensors on the CPU are memory-mapped, not read. Pickles are
    read with ``torch.load(weights_only=True)``, memory-mapped when saved in torch's zip format; a
    pickle holding anything but tensors and plain containers is refused. ``member`` picks the
    state dict out of a pickle that nests it (``{"generator": {...}, "optimizer": ...}``).
    With an index, the tensors are those its ``weight_map`` names, in its order.
    """
    path = Path(path)
    device = torch.device(device)
    if path.is_dir():
        path = _resolve_folder(path)
        if not resolves_inside(path, allowed_trees(path.parent)):
            raise CheckpointError(path, _ESCAPES)
    elif not path.exists():
        raise CheckpointError(
            path, "no such file or folder; expected a checkpoint file or a folder holding one"
        )
    if member is not None and path.suffix.lower() not in PICKLE_SUFFIXES:
        raise CheckpointError(
            path, f"member={member!r} applies to pickle checkpoints only; use strip_prefix"
        )
    if path.name.endswith(".index.json"):
        return _load_index(path, device)
    return _load_file(path, device, member)


def _resolve_folder(folder: Path) -> Path:
    for preferred, *patterns in _FOLDER_LAYOUTS:
        if (folder / preferred).is_file():
            return folder / preferred
        is_index = preferred.endswith(".index.json")
        found = sorted(
            {
                p
                for pattern in patterns
                for p in folder.glob(pattern)
                if p.is_file() and p.name.endswith(".index.json") == is_index
            }
        )
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            kind = "index files" if is_index else "checkpoint files and no index"
            raise CheckpointError(
                folder, f"ambiguous: several {kind}: {names_preview([p.name for p in found])}"
            )
    present = names_preview(sorted(p.name for p in folder.iterdir())) or "nothing"
    raise CheckpointError(
        folder,
        "no checkpoint found; expected model.safetensors.index.json, model.safetensors, "
        f"pytorch_model.bin(.index.json) or a single .safetensors/.pt file; it holds {present}",
    )


_ESCAPES = (
    "is a link to a file outside the model's folder (or its Hugging Face cache entry); "
    "refused: copy the file into the folder"
)


# Errors that keep their meaning: cancel and timeout, and out of memory (the host frees memory).
_PASS_THROUGH = (CheckpointError, EngineError, MemoryError, torch.OutOfMemoryError)


def _check_cancel() -> None:
    ctx = current_context()
    if ctx is not None:
        ctx.check_cancel()


def _load_file(path: Path, device: torch.device, member: str | None = None) -> dict[str, Tensor]:
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        return _load_safetensors(path, device)
    if suffix in PICKLE_SUFFIXES:
        return _load_pickle(path, device, member)
    raise CheckpointError(
        path,
        f"unknown checkpoint format {suffix or '(no suffix)'!r}; expected .safetensors, "
        f"{', '.join(PICKLE_SUFFIXES)}, or a folder with model.safetensors(.index.json)",
    )


def _load_safetensors(
    path: Path, device: torch.device, keys: list[str] | None = None
) -> dict[str, Tensor]:
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as file:
            available = set(file.keys())
            lacking = [k for k in keys or () if k not in available]
            if lacking:
                raise CheckpointError(
                    path,
                    f"the index places {names_preview(lacking)} in this shard, which lacks them",
                )
            tensors = {}
            for number, key in enumerate(keys if keys is not None else file.keys()):
                if number % 64 == 0:
                    _check_cancel()
                tensors[key] = file.get_tensor(key)
            return tensors
    except _PASS_THROUGH:
        raise
    except Exception as exc:  # safetensors, or torch on a header it accepted, may fail any way
        raise CheckpointError(
            path, f"not a readable safetensors file ({type(exc).__name__}: {exc})"
        ) from None


def _load_pickle(path: Path, device: torch.device, member: str | None) -> dict[str, Tensor]:
    # Only torch's zip format can be mapped; files from torch < 1.6 are read whole.
    mmap = zipfile.is_zipfile(path)
    _check_cancel()
    try:
        loaded = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        # torch's own message advises loading with weights_only=False; it is never repeated.
        code = _GLOBAL.search(str(exc))
        if code or "Unsupported global" in str(exc):
            named = f" ({code.group(1)})" if code else ""
            raise CheckpointError(
                path,
                f"refused: the file holds code{named}, not only tensors, and loading it would "
                "run that code; it is not loaded",
            ) from None
        raise CheckpointError(path, f"not a readable torch checkpoint ({_reason(exc)})") from None
    except _PASS_THROUGH:
        raise
    except Exception as exc:  # a file that is not a pickle fails inside torch in any way
        raise CheckpointError(path, f"not a readable torch checkpoint ({_reason(exc)})") from None
    if member is not None:
        if not isinstance(loaded, Mapping) or member not in loaded:
            keys = list(loaded) if isinstance(loaded, Mapping) else type(loaded).__name__
            raise CheckpointError(path, f"no member {member!r}; the checkpoint holds {keys}")
        loaded = loaded[member]
    return _as_state_dict(path, loaded, member)


_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
_ADVICE = ("weights_only", "trusted source", "file an issue", "documentation", "safe_globals")


def _reason(exc: Exception) -> str:
    """The specific line of torch's error, without its advice on loading unsafely."""
    text = str(exc).partition("WeightsUnpickler error:")[2] or str(exc)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    specific = [line for line in lines if not any(words in line for words in _ADVICE)]
    return f"{type(exc).__name__}: {specific[0] if specific else 'unreadable'}"


def _as_state_dict(path: Path, loaded: object, member: str | None) -> dict[str, Tensor]:
    where = f"member {member!r}" if member else "the checkpoint"
    if not isinstance(loaded, Mapping):
        raise CheckpointError(
            path, f"{where} is a {type(loaded).__name__}; expected a mapping of names to tensors"
        )
    others = {k: v for k, v in loaded.items() if not (isinstance(k, str) and isinstance(v, Tensor))}
    if others:
        found = ", ".join(f"{k!r} ({type(v).__name__})" for k, v in list(others.items())[:8])
        nested = [k for k, v in others.items() if isinstance(v, Mapping)]
        hint = f"; pass member= one of {nested} to pick a nested state dict" if nested else ""
        raise CheckpointError(
            path, f"expected {where} to map names to tensors, but it holds {found}{hint}"
        )
    return dict(loaded)


def _load_index(index: Path, device: torch.device) -> dict[str, Tensor]:
    try:
        with index.open("rb") as file:
            raw = file.read(MAX_INDEX_BYTES + 1)
        if len(raw) > MAX_INDEX_BYTES:
            raise CheckpointError(index, f"index JSON larger than {MAX_INDEX_BYTES} bytes")
        data = json.loads(raw.decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(index, f"not a readable index JSON ({exc})") from exc
    except RecursionError:
        raise CheckpointError(index, "not a readable index JSON (nested too deeply)") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        raise CheckpointError(
            index, 'expected a JSON object with "weight_map": {tensor name: shard file name}'
        )
    by_shard: dict[str, list[str]] = {}
    for key, shard in weight_map.items():
        by_shard.setdefault(shard, []).append(key)
    outside = [s for s in by_shard if Path(s).is_absolute() or ".." in Path(s).parts]
    if outside:
        raise CheckpointError(index, f"names shards outside its folder: {names_preview(outside)}")
    trees = allowed_trees(index.parent)
    escaping = [s for s in by_shard if not resolves_inside(index.parent / s, trees)]
    if escaping:
        raise CheckpointError(
            index,
            f"names shards that link outside its folder (or its Hugging Face cache entry): "
            f"{names_preview(escaping)}; refused",
        )
    absent = [s for s in by_shard if not (index.parent / s).is_file()]
    if absent:
        raise CheckpointError(
            index, f"names shards that do not exist in {index.parent}: {names_preview(absent)}"
        )
    tensors: dict[str, Tensor] = {}
    for shard, keys in by_shard.items():
        _check_cancel()
        shard_path = index.parent / shard
        if shard_path.suffix.lower() == ".safetensors":
            tensors.update(_load_safetensors(shard_path, device, keys))
            continue
        loaded = _load_file(shard_path, device)
        lacking = [k for k in keys if k not in loaded]
        if lacking:
            raise CheckpointError(
                shard_path,
                f"{index.name} places {names_preview(lacking)} in this shard, which lacks them",
            )
        tensors.update((k, loaded[k]) for k in keys)
    return {k: tensors[k] for k in weight_map}


def names_preview(keys: list[str], limit: int = 10) -> str:
    """The first ``limit`` names, comma-separated, and how many more there are."""
    shown = ", ".join(keys[:limit])
    return shown if len(keys) <= limit else f"{shown} and {len(keys) - limit} more"
