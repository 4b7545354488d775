"""What this machine has and what the installed torch was built for, asked without torch.

The vendors' tools (nvidia-smi, rocm-smi / amd-smi) and the platform answer first. torch is asked
only in a subprocess (``python -m mizuoto_runtime.devices.device``), and only when the
installed build may see accelerators the tools did not; once torch is imported in this process
it is asked directly.
"""

from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TypedDict


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


class TorchBuild(TypedDict):
    """What ``torch_build`` reports (``mizuoto doctor`` prints it)."""

    installed: bool
    version: str | None
    build: str | None
    accelerators: list[str]
    matches_machine: bool
    install: str | None


def torch_build() -> TorchBuild:
    """What the installed torch was built for, what this machine has, and the install to fix it."""
    values = _read_torch_version_file()
    if values is None:
        return describe_build(None, None, machine_accelerators())
    found = values.get("__version__")
    version = found if isinstance(found, str) and found else importlib.metadata.version("torch")
    build = next(
        (
            f"{kind} {values[key]}"
            for kind, key in (("cuda", "cuda"), ("rocm", "hip"), ("xpu", "xpu"))
            if values.get(key)
        ),
        "cpu",
    )
    return describe_build(version, build, machine_accelerators())


# The wheel index for a build kind, newest torch first: (oldest torch version, index). Each
# torch release is published for a few CUDA / ROCm versions only; these are ones every release
# from that version on has.
_INDEXES: dict[str, list[tuple[tuple[int, int], str]]] = {
    "cuda": [((2, 7), "cu128"), ((0, 0), "cu124")],
    "rocm": [((2, 8), "rocm6.4"), ((2, 7), "rocm6.3"), ((0, 0), "rocm6.1")],
    "cpu": [((0, 0), "cpu")],
}
_RELEASE = re.compile(r"(\d+)\.(\d+)\.(\d+)")


def describe_build(version: str | None, build: str | None, accelerators: list[str]) -> TorchBuild:
    """``torch_build``'s answer for torch ``version`` built for ``build`` (both None: torch is
    not installed) on a machine with ``accelerators`` (``machine_accelerators()``'s kinds).

    The fix for a build that does not match the machine uninstalls torch first: pip holds
    ``2.5.1+cu124`` as satisfying ``torch==2.5.1``, so a plain install from the other index
    answers "Requirement already satisfied" and changes nothing. The same version is asked for,
    so that packages pinned to it (torchaudio, torchvision) keep working.
    """
    wanted = accelerators[0] if accelerators else "cpu"
    matches = build is not None and (build.split()[0] == wanted or wanted == "mps")
    release = (version or "").split("+")[0]
    pinned = _RELEASE.fullmatch(release)
    if wanted == "mps":
        install = "pip install torch"
    else:
        at = (int(pinned[1]), int(pinned[2])) if pinned else (99, 0)
        index = next(name for since, name in _INDEXES[wanted] if at >= since)
        pin = f"torch=={release}" if pinned else "torch"
        install = f"pip install {pin} --index-url https://download.pytorch.org/whl/{index}"
    if version is not None and not matches:
        install = f"pip uninstall -y torch && {install}"
    return {
        "installed": version is not None,
        "version": version,
        "build": build,
        "accelerators": accelerators,
        "matches_machine": matches,
        "install": None if matches else install,
    }


def device_missing(device: str, build: TorchBuild) -> tuple[str, str]:
    """Why torch cannot open ``device``, as ``(cause, sentence)``; ``build`` is ``torch_build()``.

    cause ``torch_build``: the machine has the device but this torch was not built for it (the
    sentence holds the install that fixes it); ``no_device``: this machine has none;
    ``not_visible``: both have it, yet torch cannot open this one (an index past the last
    device, ``CUDA_VISIBLE_DEVICES``, a driver older than the build's CUDA).
    """
    kind = device.partition(":")[0]
    torch = f"torch {build['version']} (built for {build['build']})"
    if kind == "cuda":  # ROCm builds of torch name AMD GPUs cuda too
        machine = [a for a in build["accelerators"] if a in ("cuda", "rocm")]
        built = (build["build"] or "cpu").split()[0] in ("cuda", "rocm")
    else:
        machine = [a for a in build["accelerators"] if a == kind]
        built = kind == "mps" or (build["build"] or "cpu").split()[0] == kind
    if machine and not built:
        fix = build["install"] or "install a torch built for it"
        return "torch_build", f"this machine has a {kind} device but {torch} has no {kind}: {fix}"
    if not machine and (kind in ("cuda", "mps") or not built):
        also = f" ({torch} could use one)" if built else f", and {torch} has no {kind} either"
        return "no_device", f"this machine has no {kind} device{also}; run on cpu"
    return (
        "not_visible",
        f"{torch} and this machine both have {kind}, but {device} cannot be opened: an index "
        "past the last device, devices hidden by CUDA_VISIBLE_DEVICES, or a driver older than "
        "the build's",
    )


def _nvidia_devices() -> list[dict[str, object]]:
    out = _run(
        ["nvidia-smi", "--query-gpu=index,name,memory.total", "--format=csv,noheader,nounits"]
    )
    devices = []
    for line in (out or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[0].isdigit() and parts[2].isdigit():
            devices.append(
                {
                    "device": f"cuda:{parts[0]}",
                    "name": parts[1],
                    "total_memory": int(parts[2]) * 2**20,
                    "source": "nvidia-smi",
                }
            )
    return devices


def _amd_devices() -> list[dict[str, object]]:
    out = _run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
    try:
        cards = json.loads(out) if out else {}
    except json.JSONDecodeError:
        return []
    devices = []
    for index, (_, info) in enumerate(sorted(cards.items())):
        if not isinstance(info, dict):
            continue
        total = next((v for k, v in info.items() if "Total Memory" in k), 0)
        devices.append(
            {
                "device": f"cuda:{index}",  # ROCm builds of torch name AMD GPUs cuda:N
                "name": info.get("Card series") or info.get("Card model") or "AMD GPU",
                "total_memory": int(total) if str(total).isdigit() else 0,
                "source": "rocm-smi",
            }
        )
    return devices


def torch_devices() -> list[dict[str, object]]:
    """The accelerators torch sees, asked in this process (so it imports torch)."""
    import torch

    devices: list[dict[str, object]] = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append(
                {
                    "device": f"cuda:{index}",
                    "name": props.name,
                    "total_memory": int(props.total_memory),
                    "capability": [props.major, props.minor],
                    "source": "torch",
                }
            )
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        for index in range(xpu.device_count()):
            props = xpu.get_device_properties(index)
            devices.append(
                {
                    "device": f"xpu:{index}",
                    "name": props.name,
                    "total_memory": int(props.total_memory),
                    "source": "torch",
                }
            )
    if torch.backends.mps.is_available():
        total = int(getattr(torch.mps, "recommended_max_memory", lambda: 0)())
        devices.append(
            {"device": "mps", "name": "Apple GPU", "total_memory": total, "source": "torch"}
        )
    return devices


def _torch_devices_in_subprocess() -> list[dict[str, object]]:
    try:
        done = subprocess.run(
            [sys.executable, "-m", "mizuoto_runtime.devices.device"],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        return list(json.loads(done.stdout)["devices"]) if done.returncode == 0 else []
    except (OSError, subprocess.SubprocessError, ValueError, KeyError):
        return []


def probe_devices() -> list[dict[str, object]]:
    """Accelerators as ``{"device", "name", "total_memory", "source"}``, without importing torch.

    Asks torch directly once it is imported here; otherwise the vendors' tools, and torch in a
    subprocess only when they found nothing but the installed build targets an accelerator.
    """
    if "torch" in sys.modules:
        return torch_devices()
    found = _nvidia_devices() + _amd_devices()
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        found.append(
            {"device": "mps", "name": "Apple GPU", "total_memory": 0, "source": "platform"}
        )
    build = torch_build()["build"]
    if not found and build not in (None, "cpu"):
        found = _torch_devices_in_subprocess()
    return found
