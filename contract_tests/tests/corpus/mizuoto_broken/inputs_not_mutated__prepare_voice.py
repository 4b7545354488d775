"""inputs.not_mutated: synthesizes well, but prepare_voice normalises the caller's recording in
place (a read-only one it copies first, so only a caller's writable array changes)."""

from __future__ import annotations

import json

from mizuoto_broken.base import BaseEngine, BaseLoaded
from mizuoto_sdk import InvalidRequest


class Loaded(BaseLoaded):
    def prepare_voice(self, audio, voice_dir, params, ctx):
        samples = audio.samples
        if samples.shape[-1] == 0:
            raise InvalidRequest("audio: is empty", {"field": "audio"})
        if not samples.flags.writeable:
            samples = samples.copy()
        samples /= max(float(abs(samples).max()), 1e-6)  # the breakage: in place
        voice_dir.mkdir(parents=True, exist_ok=True)
        (voice_dir / "voice.json").write_text(json.dumps({"peak": 1.0}))
        return {"files": ["voice.json"]}


class Engine(BaseEngine):
    LOADED = Loaded
