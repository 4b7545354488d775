"""The good engine: a tiny torch model, seeded from the request, one chunk per word.

Every broken engine is this one with one step overridden. torch is imported inside the methods
(and by ``mizuoto_broken.model``, which only ``load`` imports), so importing this module is cheap.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, ClassVar

from mizuoto_sdk import AudioChunk, Engine, InvalidRequest, LoadedEngine, LoadSpec

if TYPE_CHECKING:
    import torch

    from mizuoto_runtime.context import RequestContext
    from mizuoto_runtime.runtime import Runtime

SAMPLE_RATE = 16_000
WEIGHTS_SEED = 7


class BaseLoaded(LoadedEngine):
    def __init__(self, device: str, model: torch.nn.Module) -> None:
        self.device = device
        self.model: torch.nn.Module | None = model
        self.handles = (model,)

    def describe(self) -> Mapping[str, object]:
        return {"sample_rate": SAMPLE_RATE, "device": self.device}

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        words = self.words(text) if ctx.text_input is None else self.streamed_words(text, ctx)
        generator = self.generator(ctx)
        for word in words:
            ctx.check_cancel()
            yield AudioChunk(self.render(word, generator), SAMPLE_RATE, {"word": word})

    def streamed_words(self, text: str, ctx: RequestContext) -> Iterator[str]:
        """The words of ``text`` and of the text streamed in after it, a sentence at a time."""
        from mizuoto_runtime.text.streamed import sentences

        spoken = 0
        for sentence in sentences(text, ctx):
            for word in sentence.split():
                spoken += 1
                yield word
        if not spoken:
            self.words("")

    def words(self, text: str) -> list[str]:
        words = text.split()
        if not words:
            raise InvalidRequest("text: is empty; give the words to sing", {"field": "text"})
        return words

    def generator(self, ctx: RequestContext) -> torch.Generator:
        return ctx.generator_for(self.device)

    def steps(self, word: str) -> list[int]:
        """One note per character, in semitones above 220 Hz."""
        return [ord(c) % 24 for c in word]

    def render(self, word: str, generator: torch.Generator) -> torch.Tensor:
        import torch

        assert self.model is not None, "unloaded"
        steps = torch.tensor(self.steps(word), device=self.device)  # [chars]
        jitter = 1 + 0.02 * (torch.rand(len(word), generator=generator, device=self.device) - 0.5)
        return self.model(steps, jitter)  # [chars * note]

    def unload(self) -> None:
        self.handles = ()
        self.model = None


class BaseEngine(Engine):
    DEVICES = ("cpu",)
    LOADED: ClassVar[type[BaseLoaded]] = BaseLoaded

    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        from mizuoto_broken.model import build

        return self.LOADED(spec.device, build(spec.device, self.weights_seed()))

    def weights_seed(self) -> int:
        return WEIGHTS_SEED
