"""Stands for a third-party library an engine imports (as librosa pulls in scikit-learn and rich):
at import it sets an environment variable for its worker processes and draws a session id from
the global ``random``, which changes both for every other user of the process.

It lies outside the engine's package, as a dependency does: the static scan reads only the
engine's own source, so nothing but the fresh process's diff sees it, and only the culprit the
diff names (this module's import, and the engine's module that imported it) tells the author
where to look.
"""

from __future__ import annotations

import os
import random

_BEFORE = random.getstate()  # for restore() only: a real library keeps nothing of the kind

WORKERS = "CHATTY_DEPENDENCY_WORKERS"
os.environ[WORKERS] = "1"
SESSION = random.getrandbits(64)


def restore() -> None:
    """Undo the import's changes (the module stays imported, so they are not made again)."""
    os.environ.pop(WORKERS, None)
    random.setstate(_BEFORE)
