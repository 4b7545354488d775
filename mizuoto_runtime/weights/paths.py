"""Which files a model folder may make a reader open: the rule for symbolic links.

A model's files name other files (an index names its shards, an ONNX graph its external data).
A folder from an untrusted source could name a link to any file on the machine, so every file a
model names must resolve, links followed, inside the trees this module allows:

- the model folder's own tree, as the links in it resolve (so a folder that is itself a link to
  where the files live works);
- for a folder inside a Hugging Face cache entry (``models--org--name/snapshots/<revision>/``,
  where every file is a link to ``../../blobs/<hash>``), that whole cache entry: its snapshots and
  its blobs, never another entry or anything else in the cache.

Anything else, including a link to another model's cache entry, is refused by the reader that
asked, with its own typed error. Files the caller names directly are the caller's choice and are
not checked.
"""

from __future__ import annotations

import os
from pathlib import Path

_CACHE_KINDS = ("models--", "datasets--", "spaces--")


def allowed_trees(folder: str | os.PathLike[str]) -> tuple[Path, ...]:
    """The resolved folders inside which files named by the model in ``folder`` may lie."""
    folder = Path(os.path.abspath(folder))
    trees = [folder.resolve()]
    for snapshot in (folder, *folder.parents):
        parent = snapshot.parent
        if parent.name == "snapshots" and parent.parent.name.startswith(_CACHE_KINDS):
            trees.append(parent.parent.resolve())
            break
    return tuple(trees)


def resolves_inside(path: str | os.PathLike[str], trees: tuple[Path, ...]) -> bool:
    """Whether ``path``, with every link followed, lies inside one of ``trees``.

    A link loop, or a path that cannot be resolved, is not inside.
    """
    try:
        target = Path(path).resolve(strict=False)
    except (OSError, RuntimeError, ValueError):
        return False
    return any(target == tree or target.is_relative_to(tree) for tree in trees)
