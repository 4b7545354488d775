"""Key/value caches: transformers' DynamicCache, and the opt-in preallocated BufferCache.

Both store post-norm, post-RoPE, un-repeated keys and values [B, KV, S, D] in the model dtype.
``DynamicCache`` grows by concatenation and attention sees exactly the tokens seen, as upstream's
default cache does. ``BufferCache`` (``compute.kv_cache = "static"``) allocates every layer's
buffers up front and writes in place, as upstream's StaticCache does: attention then runs over the
whole buffer with a mask, which is bitwise equal to StaticCache but not to DynamicCache, and its
fixed addresses and shapes are what CUDA graphs and torch.compile need.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from mizuoto_runtime.lm.config import DecoderConfig
from mizuoto_runtime.lm.rope import RopeState
from mizuoto_sdk.errors import InvalidRequest

__all__ = ["BufferCache", "CacheFull", "DynamicCache", "KVCache"]


class CacheFull(InvalidRequest, ValueError):
    """A BufferCache was asked to hold more tokens than it was built for.

    Its ``max_length`` is a limit declared when it was built, not memory that may free up, so a
    retry cannot succeed: the request is too long for it, and the host reports
    ``invalid_request`` with ``detail["field"] == "length"`` and the numbers.
    """

    def __init__(self, message: str, max_length: int, length: int, new: int) -> None:
        detail = {"field": "length", "reason": "cache_full", "max_length": max_length}
        super().__init__(message, {**detail, "length": length, "new": new})


class DynamicCache:
    """Attention sees exactly the tokens seen, like ``transformers.DynamicCache``.

    Upstream concatenates every step (a copy of the whole cache per layer and token). Here keys
    and values are written into buffers that double when full, and attention gets a view of the
    filled part: the same values and shapes, which SDPA turns into the same bits (the tests check
    this against upstream), without the copy. The first forward's own keys are returned as they
    are, exactly as upstream's first concatenation returns them.
    """

    static: Literal[False] = False  # a Literal, so `cache.static` tells the two apart

    def __init__(self, config: DecoderConfig, reserve: int = 0) -> None:
        self._keys: list[Tensor | None] = [None] * config.num_hidden_layers
        self._values: list[Tensor | None] = [None] * config.num_hidden_layers
        self.reserve = reserve  # tokens to make room for on the first write
        self.length = 0  # tokens held, on the host
        self.rope = RopeState(config.max_position_embeddings)

    def begin(self, new: int) -> None:
        """Prepare to take ``new`` tokens in the coming forward (nothing to do here)."""

    def _room(self, layer: int, like: Tensor, needed: int) -> tuple[Tensor, Tensor]:
        keys, values = self._keys[layer], self._values[layer]
        if keys is not None and keys.shape[2] >= needed:
            return keys, values  # type: ignore[return-value]
        batch, heads, _, dim = like.shape
        size = max(needed, self.reserve, 2 * (0 if keys is None else keys.shape[2]), 16)
        grown_keys = like.new_empty(batch, heads, size, dim)
        grown_values = like.new_empty(batch, heads, size, dim)
        if keys is not None:
            grown_keys[:, :, : self.length] = keys[:, :, : self.length]
            grown_values[:, :, : self.length] = values[:, :, : self.length]  # type: ignore[index]
        self._keys[layer], self._values[layer] = grown_keys, grown_values
        return grown_keys, grown_values

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v [B, KV, L, D] -> everything held [B, KV, S, D]
        start, end = self.length, self.length + k.shape[2]
        keys, values = self._room(layer, k, end)
        keys[:, :, start:end] = k
        values[:, :, start:end] = v
        if start == 0:
            return k, v
        return keys[:, :, :end], values[:, :, :end]

    def advance(self, new: int) -> None:
        self.length += new

    @property
    def offset(self) -> int:
        """Tokens held before the current forward (the mask's query offset)."""
        return self.length

    @property
    def keys(self) -> list[Tensor]:
        """Each layer's keys held so far [B, KV, S, D] (views)."""
        return [k[:, :, : self.length] for k in self._keys if k is not None]

    @property
    def values(self) -> list[Tensor]:
        return [v[:, :, : self.length] for v in self._values if v is not None]


class BufferCache:
    """Preallocated [B, KV, max_length, D] buffers per layer, like ``transformers.StaticCache``.

    ``position`` (a 0-d int64 tensor on the device) counts the tokens held, as upstream's
    ``cumulative_length``: positions and the mask are computed from it on the device, so a decode
    step needs no host value and can be captured in a CUDA graph. ``length`` mirrors it on the host.
    """

    static: Literal[True] = True

    def __init__(
        self,
        config: DecoderConfig,
        batch: int,
        max_length: int,
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        shape = (batch, config.num_key_value_heads, max_length, config.head_dim)
        self.keys = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.values = [
            torch.zeros(shape, dtype=dtype, device=device) for _ in range(config.num_hidden_layers)
        ]
        self.max_length = max_length
        self.position = torch.zeros((), dtype=torch.int64, device=device)
        self.length = 0
        self.rope = RopeState(config.max_position_embeddings)

    def begin(self, new: int) -> None:
        """Check that the coming ``new`` tokens fit (a host check; nothing runs on the device)."""
        if self.length + new > self.max_length:
            raise CacheFull(
                f"BufferCache holds {self.max_length} tokens; {self.length} + {new} do not fit. "
                "Build it with a larger max_length",
                self.max_length,
                self.length,
                new,
            )

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        # k, v [B, KV, L, D] written at the next L slots -> whole buffers [B, KV, max_length, D].
        # The slots are computed on the device from ``position``, per layer as upstream does, so
        # a captured step writes where ``position`` says at replay time.
        keys, values = self.keys[layer], self.values[layer]
        index = torch.arange(k.shape[2], device=keys.device) + self.position
        keys.index_copy_(2, index, k)
        values.index_copy_(2, index, v)
        return keys, values

    def advance(self, new: int) -> None:
        self.position.add_(new)
        self.length += new

    @property
    def offset(self) -> Tensor:
        """Tokens held before the current forward, as a device tensor (upstream passes it so)."""
        return self.position

    def reset(self) -> None:
        """Forget what is held (buffers keep their addresses, so captured graphs stay valid)."""
        for buffer in (*self.keys, *self.values):
            buffer.zero_()
        self.position.zero_()
        self.length = 0
        self.rope = RopeState(self.rope.original, self.rope.table)


KVCache = DynamicCache | BufferCache
