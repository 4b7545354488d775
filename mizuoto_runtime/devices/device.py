"""Devices: memory, precision, placement, and out-of-memory recognition.

Nothing here runs at import and nothing is module state. ``is_oom`` recognises an allocation
failure by its type name and message, so the host can map it without importing torch.
"""

from __future__ import annotations

import json
import platform
import sys
import threading
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

from mizuoto_runtime.devices.dtypes import (
    RULES,
    DeviceProperties,
    DtypeChoice,
    DtypeRule,
    pick_dtype,
    unsupported_reason,
)
from mizuoto_runtime.devices.meter import CountingMeter, MemoryMeter, meter_for
from mizuoto_runtime.devices.probe import probe_devices, torch_build, torch_devices
from mizuoto_sdk.manifest import device_type

if TYPE_CHECKING:
    import torch

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


class DeviceService:
    """Memory, precision and placement answers for the devices of this process.

    An object, not module state: tests build one with made-up ``properties`` or with
    ``simulate={"cpu": bytes}``, which makes the CPU report that much memory and count as an
    accelerator, so memory accounting and placement run for real without a GPU. Which of the
    two a device is, only its ``meter`` knows.
    """

    def __init__(
        self,
        simulate: Mapping[str, int] | None = None,
        properties: Mapping[str, DeviceProperties] | None = None,
        rules: Sequence[DtypeRule] = RULES,
    ) -> None:
        self._meters: dict[str, MemoryMeter] = {
            str(device): CountingMeter(str(device), size)
            for device, size in (simulate or {}).items()
        }
        self._properties = dict(properties or {})
        self._rules = tuple(rules)
        self._meters_lock = threading.Lock()

    is_oom = staticmethod(is_oom)
    probe_devices = staticmethod(probe_devices)
    torch_build = staticmethod(torch_build)

    def meter(self, device: str) -> MemoryMeter:
        """How memory on ``device`` is counted: torch's allocator on an accelerator, a counter
        on a simulated device (see ``devices.meter``). One object per device, made on first use."""
        device = str(device)
        with self._meters_lock:
            meter = self._meters.get(device)
            if meter is None:
                meter = self._meters[device] = meter_for(device)
            return meter

    def is_accelerator(self, device: str) -> bool:
        """Whether memory on ``device`` is scarce and accounted (a GPU, or a simulated one)."""
        return self.meter(device).scarce

    def memory(self, device: str) -> tuple[int, int]:
        """(free, total) bytes; on CUDA, memory torch caches but does not use counts as free."""
        return self.meter(device).memory()

    def simulated(self, device: str) -> bool:
        """Deprecated: ask ``meter(device)`` what it needs to know instead."""
        _deprecated("simulated(device)", "meter(device)")
        return isinstance(self.meter(device), CountingMeter)

    def account(self, device: str, delta: int) -> None:
        """Deprecated: ``meter(device).charge(delta)``."""
        _deprecated("account(device, delta)", "meter(device).charge(delta)")
        self.meter(device).charge(delta)

    def peak(self, device: str) -> int:
        """Deprecated: ``meter(device).peak()``."""
        _deprecated("peak(device)", "meter(device).peak()")
        return self.meter(device).peak()

    def reset_peak(self, device: str) -> None:
        """Deprecated: ``meter(device).reset_peak()``."""
        _deprecated("reset_peak(device)", "meter(device).reset_peak()")
        self.meter(device).reset_peak()

    def empty_cache(self, device: str) -> None:
        kind = device_type(str(device))
        if kind == "cpu":
            return
        import torch

        backend = getattr(torch, kind)
        if kind == "mps":
            backend.empty_cache()
        else:
            with backend.device(torch.device(device)):
                backend.empty_cache()

    def synchronize(self, device: str) -> None:
        kind = device_type(str(device))
        if kind == "cpu":
            return
        import torch

        backend = getattr(torch, kind)
        backend.synchronize() if kind == "mps" else backend.synchronize(torch.device(device))

    def properties(self, device: str) -> DeviceProperties:
        """What the dtype rules see (given at construction, or asked of torch)."""
        device = str(device)
        if device not in self._properties:
            self._properties[device] = _torch_properties(device)
        return self._properties[device]

    def supports(self, device: str, dtype: str) -> bool:
        return unsupported_reason(self.properties(device), dtype, self._rules) is None

    def pick_dtype(
        self, device: str, requested: str | None, supported: Sequence[str], cpu: str = "float32"
    ) -> DtypeChoice:
        """See ``devices.dtypes.pick_dtype``; a simulated CPU still computes like a CPU."""
        return pick_dtype(self.properties(device), requested, supported, cpu, self._rules)

    def float64_device(self, device: str) -> str:
        """Where a float64 computation runs: ``device``, or the CPU where it has no float64."""
        return str(device) if self.supports(device, "float64") else "cpu"

    @staticmethod
    def pin_to_cpu(module: torch.nn.Module) -> torch.nn.Module:
        """Keep ``module`` on the CPU when its parent moves (dtype changes still apply).

        For float64 parts such as pitch predictors on devices without float64; the caller moves
        inputs to the CPU (``float64_device`` says when).
        """
        original = module._apply

        def apply_on_cpu(
            fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
        ) -> torch.nn.Module:
            def keep(tensor: torch.Tensor) -> torch.Tensor:
                # An empty probe shows where and to what dtype ``fn`` would send the tensor,
                # without allocating on that device or copying the data there and back.
                probe = fn(tensor.new_empty(0))
                return fn(tensor) if probe.device.type == "cpu" else tensor.to(probe.dtype)

            return original(keep, recurse)

        module._apply = apply_on_cpu  # type: ignore[method-assign]  # on purpose: see the docstring
        module.cpu()
        return module


def _deprecated(old: str, new: str) -> None:
    warnings.warn(
        f"DeviceService.{old} is deprecated, use DeviceService.{new}; it goes in the next release",
        DeprecationWarning,
        stacklevel=3,
    )


def _torch_properties(device: str) -> DeviceProperties:
    kind = device_type(device)
    if kind == "cpu":
        return DeviceProperties("cpu")
    import torch

    if kind == "cuda":
        props = torch.cuda.get_device_properties(torch.device(device))
        return DeviceProperties(
            "cuda", props.name, (props.major, props.minor), hip=torch.version.hip is not None
        )
    if kind == "mps":
        release = platform.mac_ver()[0]
        version = tuple(int(p) for p in release.split(".") if p.isdigit()) or None
        return DeviceProperties("mps", "Apple GPU", macos=version)
    xpu = torch.xpu.get_device_properties(torch.device(device))
    return DeviceProperties(
        "xpu",
        xpu.name,
        bf16=bool(torch.xpu.is_bf16_supported()),
        fp64=bool(getattr(xpu, "has_fp64", True)),
    )


def _main() -> int:
    """``python -m mizuoto_runtime.devices.device``: torch's view of the devices, as JSON."""
    import torch

    print(json.dumps({"torch": torch.__version__, "devices": torch_devices()}))
    return 0


if __name__ == "__main__":
    sys.exit(_main())
