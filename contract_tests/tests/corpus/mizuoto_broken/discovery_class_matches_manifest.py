"""discovery.class_matches_manifest: the class declares cuda too; the manifest says cpu only."""

from __future__ import annotations

from mizuoto_broken.base import BaseEngine


class Engine(BaseEngine):
    DEVICES = ("cpu", "cuda")
