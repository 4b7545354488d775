{%- set convert = cookiecutter.capabilities == "synthesize+convert" -%}
{%- set prefix = cookiecutter.__class_prefix -%}
"""What the host talks to: the Engine class the manifest names, and the LoadedEngine it loads.

The Engine loads the model; the LoadedEngine checks each request and streams its audio, one
chunk per word{% if convert %} (and for convert, one chunk per block of the input){% endif %}.

The model itself lives in ``model.py``, imported inside ``load``: the host imports this module to
compare it with the manifest before any device is chosen, and that must stay cheap
{%- if cookiecutter.uses_torch %}
and free of torch{% endif %}.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from mizuoto_sdk import AudioChunk, Engine, InvalidRequest, LoadedEngine, LoadSpec

if TYPE_CHECKING:
    from {{ cookiecutter.__package_name }}.model import TinyVoice
    from mizuoto_sdk import RequestContext, Runtime
{%- if convert %}

BLOCK_SECONDS = 0.1  # convert streams its input in blocks of this length
{%- endif %}


class {{ prefix }}Engine(Engine):
    """Devices, dtypes and extras are the manifest's (plugin.py): declared there, once."""

    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        from {{ cookiecutter.__package_name }}.model import build

        # Replace: load your model here. build() reads spec.model_dir when the manifest's
        # ModelEntry names files; loading runs outside inference mode and draws nothing random.
{%- if cookiecutter.uses_torch %}
        voice = build(spec.model_dir, spec.device, spec.dtype)
{%- else %}
        voice = build(spec.model_dir)
{%- endif %}
        return Loaded{{ prefix }}(voice, spec)


class Loaded{{ prefix }}(LoadedEngine):
    """One loaded model. The host calls it in inference mode, with the request's context bound."""

    def __init__(self, voice: TinyVoice, spec: LoadSpec) -> None:
        self.voice = voice
        self.spec = spec
{%- if cookiecutter.uses_torch %}
        self.handles = (voice,)  # every torch module it holds: the host moves and frees them
{%- endif %}

    def describe(self) -> Mapping[str, object]:
        return {
            "model": self.spec.model_id,
            "device": self.spec.device,
            "dtype": self.spec.dtype,
            "sample_rate": self.voice.sample_rate,
        }

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        # A generator: nothing runs until the host asks for the first chunk (stream.lazy).
        if not isinstance(text, str) or not text.strip():
            raise InvalidRequest(f"text: expected words to speak, got {text!r}", {"field": "text"})
        speed = params["speed"]  # declared in plugin.py: the host has checked it
        words = text.split()
{%- if cookiecutter.uses_torch %}
        generator = ctx.generator_for(self.spec.device)  # seeded by the request, never global
{%- else %}
        generator = ctx.rng  # seeded by the request, never global
{%- endif %}
        for index, word in enumerate(words):
            ctx.check_cancel()  # a cancel or timeout stops the stream here
            samples = self.voice.speak(word, speed, generator)
            ctx.progress(index + 1, len(words))
            yield AudioChunk(samples, self.voice.sample_rate, {"word": word})
{%- if convert %}

    def convert(
        self, audio: AudioChunk, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        if not isinstance(audio, AudioChunk) or audio.samples.shape[-1] == 0:
            raise InvalidRequest(
                "audio: expected an AudioChunk with at least one sample", {"field": "audio"}
            )
        drive = params["drive"]
        context = self.voice.context
        padded = self.voice.prepare(audio)  # [context + n + context], at the model's rate
        block = round(BLOCK_SECONDS * self.voice.sample_rate)
        for start in range(0, len(padded) - 2 * context, block):
            ctx.check_cancel()
            window = padded[start : start + block + 2 * context]  # a block and its context
            yield AudioChunk(self.voice.transform(window, drive), self.voice.sample_rate)
{%- endif %}
