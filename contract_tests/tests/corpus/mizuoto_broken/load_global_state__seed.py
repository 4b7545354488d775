"""load.global_state, disguised: loading seeds torch's global generator through a function named
by the model's options (a name read at run time, which no static scan resolves), so that the
weights come out the same every time."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine

_SAVED: list[object] = []  # numpy copies: a tensor kept here would outlive every unload


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        import torch

        if not _SAVED:
            _SAVED.append(torch.get_rng_state().numpy().copy())
        seeding = spec.options.get("seeding", "manual_seed")
        getattr(torch, seeding)(0)  # the breakage: a global seed drawn at load
        return super().load(spec, runtime, ctx)


def restore() -> None:
    """Put torch's global generator back as it was before the first load."""
    import torch

    if _SAVED:
        torch.default_generator.set_state(torch.from_numpy(_SAVED.pop()))
