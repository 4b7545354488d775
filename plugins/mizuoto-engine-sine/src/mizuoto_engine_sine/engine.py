"""The sine engine: text -> one tone per character, one chunk per word.

Pitches jitter slightly, drawn from the request's generator, so that a seed means something: the
same seed gives the same bytes, another seed other bytes. torch is imported inside the methods,
never at module level, so that importing this module stays cheap. Text streamed in
(``ctx.text_input``, declared ``text_input=True``) is spoken as its sentences finish.

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
        from mizuoto_runtime.text.streamed import sentences

        speed = cast(
            float, params["speed"]
        )  # checked by the host against the manifest's declaration
        generator = ctx.generator_for(self.device)
        # The text, or the pieces streamed in after it (ctx.text_input), sentence by sentence;
        # words never straddle two sentences, so the words are those of the whole text.
        spoken = 0
        for sentence in sentences(text, ctx, max_characters=MAX_TEXT_CHARACTERS):
            for word in sentence.split():
                ctx.check_cancel()
                samples = self._word(word, float(speed), generator)
                spoken += 1
                ctx.progress(spoken, None if ctx.text_input is not None else len(text.split()))
                yield AudioChunk(samples, SAMPLE_RATE, {"word": word})
        if not spoken:
            raise InvalidRequest(
                "text: is empty; give the words to turn into tones", {"field": "text"}
            )

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
