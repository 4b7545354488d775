"""The vits engine: load a VITS folder, speak text sentence by sentence.

``synthesize`` cuts the text into sentences (``mizuoto_runtime.text.split_sentences``), turns
each into ids as ``VitsTokenizer`` would (tokenizer.py) and runs the model on it (model.py),
yielding each sentence's audio as soon as it exists. One request generator serves every
sentence in order, so a one-sentence text gives upstream's waveform for the seed, and a longer
one gives the same audio each time for the seed. Text streamed in (``ctx.text_input``, declared
``text_input=True``) goes the same way as its sentences finish: fed in any pieces, it gives the
audio of the joined text.

This module is what the manifest's ``implementation`` names, so it imports neither torch nor the
modules that do until a model is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict
from typing import TYPE_CHECKING, cast

from mizuoto_engine_vits.params import SynthesisParams
from mizuoto_sdk import (
    AudioChunk,
    Engine,
    EngineError,
    InvalidRequest,
    LoadedEngine,
    LoadSpec,
    ModelHandle,
    RequestContext,
    Runtime,
)

if TYPE_CHECKING:
    from mizuoto_engine_vits.config import VitsConfig
    from mizuoto_engine_vits.model import Controls, VitsModel
    from mizuoto_engine_vits.tokenizer import VitsTokenizer

MAX_TEXT_CHARS = 4000
"""The longest text one request may give (characters)."""


def _nothing_to_say() -> InvalidRequest:
    return InvalidRequest(
        "text: has no character the model's vocabulary holds; give some words",
        {"field": "text"},
    )


class VitsEngine(Engine):
    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        import torch

        from mizuoto_engine_vits.model import load_model
        from mizuoto_engine_vits.tokenizer import VitsTokenizer

        if spec.model_dir is None:
            raise EngineError(f"model {spec.model_id!r} has no files to load")
        tokenizer = VitsTokenizer.from_folder(spec.model_dir)
        config, model = load_model(
            spec.model_dir, device=spec.device, dtype=getattr(torch, spec.dtype)
        )
        handle = ModelHandle(
            model,
            name=f"vits/{spec.model_id}@{spec.model_dir.resolve()}",
            load_device=spec.device,
            units=model.execution_order(),
        )
        return LoadedVits(spec, config, tokenizer, handle)


class LoadedVits(LoadedEngine):
    """The model behind one ModelHandle, and the folder's tokenizer."""

    handles: tuple[ModelHandle, ...]

    def __init__(
        self, spec: LoadSpec, config: VitsConfig, tokenizer: VitsTokenizer, handle: ModelHandle
    ) -> None:
        self.spec = spec
        self.config = config
        self.tokenizer = tokenizer
        self.handles = (handle,)

    @property
    def model(self) -> VitsModel:
        return cast("VitsModel", self.handles[0].module)  # load() gave it the model

    def describe(self) -> Mapping[str, object]:
        config = self.config
        return {
            "model": self.spec.model_id,
            "device": self.spec.device,
            "dtype": self.spec.dtype,
            "sample_rate": config.sampling_rate,
            "hop_length": config.hop_length,
            "speakers": config.speakers,
            "stochastic_duration": config.use_stochastic_duration_prediction,
            "defaults": {
                "speaking_rate": config.speaking_rate,
                "noise_scale": config.noise_scale,
                "noise_scale_duration": config.noise_scale_duration,
            },
            "parameters": sum(p.numel() for p in self.model.parameters()),
            "limits": {"text_chars": MAX_TEXT_CHARS},
        }

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        import torch

        from mizuoto_engine_vits.model import DurationError
        from mizuoto_runtime.text.streamed import sentences

        controls = self._controls(SynthesisParams.from_params(params))
        if not isinstance(text, str):
            raise InvalidRequest(
                f"text: expected a string, got {type(text).__name__}", {"field": "text"}
            )
        # The text, or the pieces streamed in after it (ctx.text_input) as sentences finish;
        # a whole text is read at once, so that the count is known and a bad one is refused
        # before any work.
        said: Iterable[tuple[str, list[int]]] = (
            (s, self.tokenizer.ids(s)) for s in sentences(text, ctx, max_characters=MAX_TEXT_CHARS)
        )
        total = None
        if ctx.text_input is None:
            said = [(s, ids) for s, ids in said if ids]
            total = len(said)
            if not said:
                raise _nothing_to_say()
        model = self.model
        duration_generator = ctx.generator_for("cpu")  # upstream's duration noise: CPU, always
        prior_generator = ctx.generator_for(model.device)
        rate = self.config.sampling_rate
        spoken = 0
        for sentence, ids in said:
            if not ids:
                continue
            ctx.check_cancel()
            batch = torch.tensor([ids], dtype=torch.long, device=model.device)
            try:
                wave = ctx.run(
                    "vits.sentence",
                    model,
                    batch,
                    controls,
                    duration_generator=duration_generator,
                    prior_generator=prior_generator,
                    handles=self.handles,
                )
            except DurationError as error:
                raise InvalidRequest(
                    f"params.speaking_rate: {error}; give a higher speaking_rate",
                    {"field": "params.speaking_rate"},
                ) from None
            spoken += 1
            ctx.applied["vits"] = {"sentences": spoken, **asdict(controls)}
            ctx.progress(spoken, total, "sentences")
            yield AudioChunk(wave[0].float().cpu().numpy(), rate, {"sentence": sentence})
        if not spoken:
            raise _nothing_to_say()

    def _controls(self, request: SynthesisParams) -> Controls:
        from mizuoto_engine_vits.model import Controls

        config = self.config
        if request.speaker is not None and request.speaker >= config.speakers:
            raise InvalidRequest(
                f"params.speaker: expected a speaker id in [0, {config.speakers - 1}] for this "
                f"model, got {request.speaker}",
                {"field": "params.speaker"},
            )

        def pick(value: float | None, default: float) -> float:
            return default if value is None else value

        return Controls(
            speaking_rate=pick(request.speaking_rate, config.speaking_rate),
            noise_scale=pick(request.noise_scale, config.noise_scale),
            noise_scale_duration=pick(request.noise_scale_duration, config.noise_scale_duration),
            speaker=request.speaker,
        )

    def unload(self) -> None:
        self.handles = ()
