"""The ranks of one replica going through a request together.

Every rank of a multi-rank replica runs the same engine code, and the collectives in it must meet
in the same order on every rank. So whether to take the next step of a stream (compute its next
chunk) is decided by the output rank (rank 0 of the ``world`` group) and broadcast: a cancel, a
timeout or a caller that closed the stream stops every rank at the same chunk boundary, never in
the middle of a collective. Under an external launcher the output rank also shares the request
itself, so every rank runs the request rank 0 was given.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mizuoto_runtime.parallel import Groups

GO, CLOSED, CANCELLED, TIMED_OUT = 0, 1, 2, 3
"""What the output rank decides before each step: go on, or stop and why."""


class Lockstep:
    def __init__(self, groups: Groups) -> None:
        self._groups = groups

    @property
    def output(self) -> bool:
        """Whether this process is the output rank, whose answers reach the caller."""
        return self._groups.rank("world") == 0

    @property
    def ranks(self) -> int:
        return self._groups.size("world")

    def agree(self, decision: int) -> int:
        """The output rank's ``decision``, on every rank (the others' argument is ignored)."""
        if self.ranks == 1:
            return decision
        import torch

        value = torch.tensor([decision], dtype=torch.int64)
        self._groups.broadcast(value, src=0, group="world")
        return int(value.item())

    def share(self, header: dict[str, Any], payload: bytes) -> tuple[dict[str, Any], bytes]:
        """The output rank's request (a JSON header and raw bytes), on every rank."""
        if self.ranks == 1:
            return header, payload
        import torch

        body = json.dumps(header).encode()
        sizes = torch.tensor([len(body), len(payload)], dtype=torch.int64)
        self._groups.broadcast(sizes, src=0, group="world")
        length, extra = (int(n) for n in sizes.tolist())
        if self.output:
            data = torch.frombuffer(bytearray(body + payload), dtype=torch.uint8)
        else:
            data = torch.empty(length + extra, dtype=torch.uint8)
        self._groups.broadcast(data, src=0, group="world")
        raw = data.numpy().tobytes()
        return json.loads(raw[:length]), raw[length:]

    def close(self) -> None:
        """Leave the ranks' process groups (a rank process does, as it stops)."""
        self._groups.close()
