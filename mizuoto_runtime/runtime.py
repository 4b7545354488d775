"""The process's runtime, created by the host on the first model load (which imports torch)."""

from __future__ import annotations

import contextlib
from typing import Any

from mizuoto_runtime.device import is_oom


class Runtime:
    """What every engine in the process shares. The host creates one, on the first load."""

    def __init__(self) -> None:
        import torch

        self._torch = torch
        self.torch_version: str = torch.__version__

    def inference_mode(self) -> contextlib.AbstractContextManager[Any]:
        """The mode every engine call runs in (loads run outside it, so weights stay normal)."""
        return self._torch.inference_mode()

    def device_available(self, device: str) -> bool:
        """Whether this torch build can place tensors on ``device`` (``"cuda:1"``, ``"mps"``)."""
        kind, _, index = device.partition(":")
        if kind == "cpu":
            return True
        backend = getattr(self._torch, kind, None)
        if backend is None or not backend.is_available():
            return False
        count = getattr(backend, "device_count", lambda: 1)()
        return int(index or 0) < count

    def release(self, device: str) -> None:
        """Give cached but unused allocator memory on ``device`` back to the driver."""
        kind = device.partition(":")[0]
        if kind == "cuda" and self._torch.cuda.is_available():
            with self._torch.cuda.device(self._torch.device(device)):
                self._torch.cuda.empty_cache()
        elif kind == "mps" and hasattr(self._torch, "mps"):
            self._torch.mps.empty_cache()
        elif kind == "xpu" and hasattr(self._torch, "xpu") and self._torch.xpu.is_available():
            self._torch.xpu.empty_cache()

    is_oom = staticmethod(is_oom)
