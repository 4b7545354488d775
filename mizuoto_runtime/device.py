"""Device facts that must be answerable without importing torch.

``is_oom`` recognises an allocation failure by its type name and message, so the host can map it
without importing torch. ``torch_build`` reads what the installed torch was built for from its
``version.py`` file, and which accelerators this machine has from the vendors' tools.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import platform
import shutil
import subprocess
from pathlib import Path

_OOM_TYPES = {"OutOfMemoryError", "MemoryError"}
_OOM_MESSAGES = ("out of memory", "can't allocate memory", "cudnn_status_alloc_failed")


def is_oom(error: BaseException) -> bool:
    """True when ``error`` says a device (or the host) ran out of memory."""
    if any(cls.__name__ in _OOM_TYPES for cls in type(error).__mro__):
        return True
    if isinstance(error, RuntimeError):
        message = str(error).lower()
        return any(text in message for text in _OOM_MESSAGES)
    return False


def _read_torch_version_file() -> dict[str, object] | None:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "version.py"
    values: dict[str, object] = {}
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, SyntaxError):
        return values
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else getattr(node, "target", None)
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            values[target.id] = value.value
    return values


def _run(command: list[str]) -> str | None:
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def machine_accelerators() -> list[str]:
    """Accelerator kinds this machine has, asked of the vendors' tools (never of torch)."""
    found = []
    smi = _run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"])
    if smi and smi.strip():
        found.append("cuda")
    if _run(["rocm-smi", "--showproductname"]) or _run(["amd-smi", "list"]):
        found.append("rocm")
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        found.append("mps")
    return found


def torch_build() -> dict[str, object]:
    """What the installed torch was built for, what this machine has, and the install to fix it."""
    values = _read_torch_version_file()
    accelerators = machine_accelerators()
    if values is None:
        build = None
        version = None
    else:
        version = values.get("__version__") or importlib.metadata.version("torch")
        build = next(
            (
                f"{kind} {values[key]}"
                for kind, key in (("cuda", "cuda"), ("rocm", "hip"), ("xpu", "xpu"))
                if values.get(key)
            ),
            "cpu",
        )
    wanted = accelerators[0] if accelerators else "cpu"
    matches = build is not None and (build.split()[0] == wanted or wanted == "mps")
    index = {"cuda": "cu128", "rocm": "rocm6.4", "cpu": "cpu"}.get(wanted)
    if wanted == "mps":
        install = "pip install torch"
    else:
        install = f"pip install torch --index-url https://download.pytorch.org/whl/{index}"
    return {
        "installed": values is not None,
        "version": version,
        "build": build,
        "accelerators": accelerators,
        "matches_machine": matches,
        "install": None if matches else install,
    }
