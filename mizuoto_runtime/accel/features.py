"""The one place that sets torch.backends switches, and only for the block that asked.

``compute.fast`` trades exactness for speed where hardware offers it: TF32 matmuls and cuDNN
convolutions on NVIDIA GPUs (float32 inputs rounded to a 10-bit mantissa inside the tensor cores).
On the CPU it changes nothing. The switches are process-wide, so ``apply`` is a context manager:
it sets them for the engine call it wraps and puts back exactly what it found, leaving the global
state snapshot unchanged afterwards. Other threads computing during the block see the switches
too; the host runs engine calls of one process one at a time on a device for this reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping

import torch

__all__ = ["FAST", "apply"]

FAST = "compute.fast"


@contextlib.contextmanager
def apply(settings: Mapping[str, object]) -> Iterator[dict[str, object]]:
    """Set the switches ``settings`` asks for during the block, then restore them.

    Yields what was changed (name -> value), for the request's ``applied``; empty when
    ``compute.fast`` is off.
    """
    changed: dict[str, object] = {}
    if not settings.get(FAST, False):
        yield changed
        return
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        changed.update({"cuda.matmul.allow_tf32": True, "cudnn.allow_tf32": True})
        yield changed
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
