"""The process's runtime, created by the host on the first model load (which imports torch)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from mizuoto_runtime.devices.device import DeviceService
from mizuoto_runtime.memory.manager import ModelManager
from mizuoto_runtime.memory.policy import SettingsLike, compute_of
from mizuoto_runtime.parallel import Groups


class Runtime:
    """What every engine in the process shares. The host creates one, on the first load.

    ``simulate`` is passed to the DeviceService (``{"cpu": bytes}`` makes the CPU play a GPU);
    without it, the setting ``compute.simulate_vram_mb`` does the same. ``settings``: the compute
    settings, as a ``ComputeSettings``, something holding the current one (the host's
    ``Settings``: the memory manager's policy reads it again at each model load) or dotted keys.
    ``parallel``: this rank's named groups, for loading its shard; a worker of a multi-rank
    replica sets it at startup, before the first load (``Groups.single()`` otherwise).
    """

    def __init__(
        self,
        simulate: Mapping[str, int] | None = None,
        settings: SettingsLike | None = None,
        *,
        parallel: Groups | None = None,
    ) -> None:
        import torch

        self._torch = torch
        self.torch_version: str = torch.__version__
        megabytes = compute_of(settings).simulate_vram_mb
        if simulate is None and megabytes is not None:
            simulate = {"cpu": int(megabytes * 2**20)}
        self.devices = DeviceService(simulate=simulate)
        self.manager = ModelManager(self.devices, settings)
        self.parallel = Groups.single() if parallel is None else parallel

    @property
    def parallel(self) -> Groups:
        return self._parallel

    @parallel.setter
    def parallel(self, groups: Groups) -> None:
        if not isinstance(groups, Groups):
            raise TypeError(f"parallel: expected Groups, got {type(groups).__name__}")
        self._parallel = groups

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
        self.devices.empty_cache(device)

    def is_oom(self, error: BaseException) -> bool:
        return self.devices.is_oom(error)
