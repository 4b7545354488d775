"""load.global_state, disguised: loading seeds torch's global generator through a computed name,
so that the weights come out the same every time."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine

_SAVED: list[object] = []


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        import torch

        if not _SAVED:
            _SAVED.append(torch.get_rng_state())
        getattr(torch, "manual" + "_seed")(0)  # the breakage: a global seed drawn at load
        return super().load(spec, runtime, ctx)


def restore() -> None:
    """Put torch's global generator back as it was before the first load."""
    import torch

    if _SAVED:
        getattr(torch, "set_rng_state")(_SAVED.pop())  # noqa: B009 - undone past the scan
