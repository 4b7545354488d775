"""load.global_state, by a dependency: the engine imports a library (``chatty_dependency``,
standing for one such as rich, which librosa pulls in) that sets an environment variable and
draws from the global ``random`` at import. The engine's own code does nothing wrong itself; the
check names the library's import, and this module as its importer, as the culprit."""

from __future__ import annotations

from chatty_dependency import SESSION, restore  # the breakage: this import changes state

from mizuoto_broken.base import BaseEngine

__all__ = ["SESSION", "Engine", "restore"]  # restore(): the corpus's undo, the library's own


class Engine(BaseEngine):
    pass
