"""The sine engine: text -> one tone per character, one chunk per word.

Pitches jitter slightly, drawn from the request's generator, so that a seed means something: the
same seed gives the same bytes, another seed other bytes. torch is imported inside the methods,
never at module level, so that importing this module stays cheap.

The text is bounded (``MAX_TEXT_CHARACTERS``, declared in ``describe()``): audio and memory grow
with every character, so a request larger than any sentence is refused before any work.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, cast

from mizuoto_sdk import (
    AudioChunk,
    Engine,
    InvalidRequest,
    LoadedEngine,
    LoadSpec,
    RequestContext,
    Runtime,
)

if TYPE_CHECKING:
    import torch

SAMPLE_RATE = 16_000
NOTE_SECONDS = 0.06
PAUSE_SECONDS = 0.04
MAX_TEXT_CHARACTERS = 1000  # about a minute of tones at speed 1, four at speed 0.25


class SineEngine(Engine):
    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        return LoadedSine(spec.device)


class LoadedSine(LoadedEngine):
    def __init__(self, device: str) -> None:
        self.device = device

    def describe(self) -> Mapping[str, object]:
        return {
            "sample_rate": SAMPLE_RATE,
            "device": self.device,
            "limits": {"text_characters": MAX_TEXT_CHARACTERS},
        }

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        if len(text) > MAX_TEXT_CHARACTERS:
            raise InvalidRequest(
                f"text: {len(text)} characters is more than this engine's "
                f"{MAX_TEXT_CHARACTERS}; split it and synthesize each part",
                {"field": "text", "limit": MAX_TEXT_CHARACTERS},
            )
        words = text.split()
        if not words:
            raise InvalidRequest(
                "text: is empty; give the words to turn into tones", {"field": "text"}
            )
        speed = cast(
            float, params["speed"]
        )  # checked by the host against the manifest's declaration
        generator = ctx.generator_for(self.device)
        for index, word in enumerate(words):
            ctx.check_cancel()
            samples = self._word(word, float(speed), generator)
            ctx.progress(index + 1, len(words))
            yield AudioChunk(samples, SAMPLE_RATE, {"word": word})

    def _word(self, word: str, speed: float, generator: torch.Generator) -> torch.Tensor:  # [n]
        import torch

        note = round(SAMPLE_RATE * NOTE_SECONDS / speed)
        # One semitone step per character code, two octaves above 220 Hz; +-1% seeded jitter.
        steps = torch.tensor([ord(c) % 24 for c in word], dtype=torch.float32, device=self.device)
        jitter = 1 + 0.02 * (torch.rand(len(word), generator=generator, device=self.device) - 0.5)
        pitch = 220.0 * torch.pow(2.0, steps / 12) * jitter  # [chars]
        t = torch.arange(note, dtype=torch.float32, device=self.device) / SAMPLE_RATE  # [note]
        envelope = torch.hann_window(note, periodic=False, device=self.device)
        tones = 0.3 * envelope * torch.sin(2 * torch.pi * pitch[:, None] * t)  # [chars, note]
        pause = torch.zeros(round(SAMPLE_RATE * PAUSE_SECONDS / speed), device=self.device)
        return torch.cat([tones.reshape(-1), pause])
