"""Small models, a copy counter and byte builders shared by several test modules.

One copy each, so a change to what the tests build is made once; kept tiny so tests stay fast
on CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from mizuoto_runtime import ops


class Stack(nn.Module):
    """Blocks called through their forward, so streaming goes through forward hooks."""

    def __init__(self, blocks: int, width: int = 16, outputs: int = 3) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(ops.default.Linear(width, width) for _ in range(blocks))
        self.head = ops.default.Linear(width, outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


class HostCopies(TorchFunctionMode):
    """Counts the copies torch makes out of the host tensors of ``parts`` (one per unit staged)."""

    def __init__(self, parts: list[Any]) -> None:
        super().__init__()
        self.sources = {part.tensors[0].data_ptr() for part in parts}
        self.count = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.copy_ and args[1].data_ptr() in self.sources:
            self.count += 1
        return func(*args, **(kwargs or {}))


def varint(value: int) -> bytes:
    """A protobuf base-128 varint; negative values wrap to 64 bits, as protobuf writes them."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
        value >>= 7
        if not value:
            return bytes(out)


def field(number: int, wire_type: int, payload: bytes | int) -> bytes:
    """One protobuf field: varint (0), length-delimited (2), or fixed-width bytes (1, 5)."""
    key = varint(number << 3 | wire_type)
    if wire_type == 0:
        return key + varint(payload)  # type: ignore[arg-type]
    if wire_type == 2:
        return key + varint(len(payload)) + payload  # type: ignore[arg-type]
    return key + payload  # type: ignore[operator]
