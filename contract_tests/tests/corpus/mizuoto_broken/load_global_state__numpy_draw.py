"""load.global_state, in the engine's own load: it draws a warm-up input from numpy's global
generator (``np.random.random``), which moves the stream of every other user of numpy in the
process. No static scan flags a draw (only seeding), and the draw never reaches the audio, so only
the fresh process's diff sees it; the check names the line of the load that drew."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine

_SAVED: list[object] = []


class Engine(BaseEngine):
    def load(self, spec, runtime, ctx):
        import numpy as np

        if not _SAVED:
            _SAVED.append(np.random.get_bit_generator().state)
        warmup = np.random.random(16)  # the breakage: a draw from the global generator
        assert warmup.shape == (16,)
        return super().load(spec, runtime, ctx)


def restore() -> None:
    """Put numpy's global generator back as it was before the first load."""
    import numpy as np

    if _SAVED:
        np.random.get_bit_generator().state = _SAVED.pop()
