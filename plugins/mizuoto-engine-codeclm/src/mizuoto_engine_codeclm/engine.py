"""The codec-LM engine: load the two networks, stream speech, prepare voices.

``synthesize`` turns text into a prompt (tokenizer.py), lets the decoder write code frames
(decoding.py) and plays every ``chunk_frames`` of them through the codec as one chunk (model.py),
so audio starts after the first chunk's frames rather than after the whole utterance.
``prepare_voice`` stores a speaker embedding (voice.py) that ``params["voice"]`` then names.

This module is what the manifest's ``implementation`` names, so it imports neither torch nor the
modules that do until a model is loaded.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, cast

from mizuoto_engine_codeclm.params import SynthesisParams
from mizuoto_sdk import (
    AudioChunk,
    Engine,
    EngineError,
    InvalidRequest,
    LoadedEngine,
    LoadSpec,
    ModelHandle,
    ParallelConfig,
    RequestContext,
    Runtime,
)

if TYPE_CHECKING:
    from torch.nn import Module

    from mizuoto_engine_codeclm.model import Codec, ModelConfig
    from mizuoto_runtime import Compiled, QwenDecoder


class CodecLMEngine(Engine):
    @classmethod
    def validate_parallel(cls, parallel: ParallelConfig, replica_world_size: int) -> None:
        """Heads are split whole over attention_tp and the MLP's inner width over dense_tp:
        refuse sizes that do not divide the bundled decoder's, before any rank starts."""
        decoder = json.loads((Path(__file__).parent / "weights" / "config.json").read_text())
        decoder = decoder["decoder"]
        attention = parallel.resolved("attention").tp_size
        dense = parallel.resolved("dense").tp_size
        heads, kv_heads = decoder["num_attention_heads"], decoder["num_key_value_heads"]
        if heads % attention or kv_heads % attention:
            raise InvalidRequest(
                f"engines.codeclm.parallel: attention.tp_size={attention} must divide the "
                f"decoder's {heads} attention heads and {kv_heads} key-value heads; use 1 or 2",
                {"field": "engines.codeclm.parallel", "engine": "codeclm"},
            )
        if decoder["intermediate_size"] % dense:
            raise InvalidRequest(
                f"engines.codeclm.parallel: dense.tp_size={dense} must divide the decoder's "
                f"intermediate size {decoder['intermediate_size']}",
                {"field": "engines.codeclm.parallel", "engine": "codeclm"},
            )

    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        import torch

        from mizuoto_engine_codeclm.model import load_model

        if spec.model_dir is None:
            raise EngineError(f"model {spec.model_id!r} has no files to load")
        config, decoder, codec = load_model(
            spec.model_dir,
            dtype=getattr(torch, spec.dtype),
            device=spec.device,
            parallel=runtime.parallel,  # several ranks: each holds its share of the decoder
        )
        name = f"codeclm/{spec.model_id}"
        handles = (
            ModelHandle(decoder, name=f"{name}:decoder", load_device=spec.device, kind="sequence"),
            # One part: the codec (1.2 MB) is small next to the decoder, and runs once per chunk.
            ModelHandle(codec, name=f"{name}:codec", load_device=spec.device, units=()),
        )
        return LoadedCodecLM(spec, config, handles)


class LoadedCodecLM(LoadedEngine):
    """The decoder and codec, read through their ModelHandles so the host may place them."""

    handles: tuple[ModelHandle, ...]

    def __init__(
        self, spec: LoadSpec, config: ModelConfig, handles: tuple[ModelHandle, ModelHandle]
    ) -> None:
        from mizuoto_engine_codeclm.tokenizer import PromptTokenizer

        self.spec = spec
        self.config = config
        # spec.model_dir is set: load() refused a model without files
        self.tokenizer = PromptTokenizer.from_pretrained(
            cast("Path", spec.model_dir), config.tokens
        )
        self.handles = handles
        self._compiled: dict[str, Compiled] = {}  # compile_module wrappers, made on first use

    @property
    def voices_dir(self) -> Path | None:
        """The model's own voices: a ``voices`` folder among its files (none ship today)."""
        return None if self.spec.model_dir is None else self.spec.model_dir / "voices"

    @property
    def decoder(self) -> QwenDecoder:
        return cast("QwenDecoder", self.handles[0].module)  # load() gave it the decoder

    @property
    def codec(self) -> Codec:
        return cast("Codec", self.handles[1].module)

    def describe(self) -> Mapping[str, object]:
        from mizuoto_engine_codeclm import voice

        codec = self.config.codec
        return {
            "model": self.spec.model_id,
            "device": self.spec.device,
            "dtype": self.spec.dtype,
            "sample_rate": codec.sample_rate,
            "frame_rate": codec.sample_rate / codec.hop,
            "codebook": codec.codebook,
            "parameters": {
                "decoder": sum(p.numel() for p in self.decoder.parameters()),
                "codec": sum(p.numel() for p in self.codec.parameters()),
            },
            # The largest input a request may give; more is an InvalidRequest naming the field.
            "limits": {
                "text_bytes": self.config.tokens.max_text_bytes,
                "voice_sample_rate": [voice.MIN_RATE, voice.MAX_RATE],
                "voice_seconds": voice.MAX_RECORDING_SECONDS,
                "voice_channels": voice.MAX_CHANNELS,
            },
        }

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        import torch

        from mizuoto_engine_codeclm.decoding import frames
        from mizuoto_engine_codeclm.model import CodecStream
        from mizuoto_engine_codeclm.voice import read_voice
        from mizuoto_runtime import SamplingParams, find_voice, voice_roots

        request = SynthesisParams.from_params(params)
        text_bytes = len(self.tokenizer.text_bytes(text))
        embedding = None
        if request.voice is not None:  # only inside the model's voices and voices.roots
            roots = voice_roots(ctx.settings, self.voices_dir)
            embedding = read_voice(find_voice(request.voice, roots))
        prompt = self.tokenizer.prompt(text, embedding)
        limit = self._frame_limit(request, text_bytes, len(prompt))
        sampling = SamplingParams(
            do_sample=True,
            temperature=request.temperature,
            top_k=request.top_k,
            top_p=request.top_p,
            repetition_penalty=request.repetition_penalty,
            min_new_tokens=min(self.config.generation.min_frames, limit),
            eos_token_id=self.tokenizer.end,
        )
        ctx.applied["codeclm"] = {"voice": embedding is not None, "max_frames": limit}
        stream = CodecStream.of(self.codec, self._compile(self.codec, "codeclm.codec", ctx))
        decoder = self._compile(self.decoder, "codeclm.decoder", ctx) or self.decoder
        codes = frames(
            decoder,
            prompt,
            sampling,
            audio_vocab=self.tokenizer.audio_vocab,
            end=self.tokenizer.end,
            max_frames=limit,
            ctx=ctx,
        )
        rate, done = self.config.codec.sample_rate, 0
        for batch in _batched(codes, request.chunk_frames):
            samples = stream.push(torch.tensor(batch, dtype=torch.long, device=self.decoder.device))
            done += len(batch)
            # ``limit`` is a bound, not the count: the decoder stops at its end code, so the total
            # is unknown until then, and the last report gives the real one.
            ctx.progress(done, None, f"frames (at most {limit})")
            yield AudioChunk(samples.float().cpu().numpy(), rate, {"frames": done})
        ctx.progress(done, done, "frames")
        ctx.applied["codeclm"]["frames"] = done

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: Path, params: Mapping[str, object], ctx: RequestContext
    ) -> Mapping[str, object]:
        """Write ``voice.json`` (the speaker embedding of ``audio``) into ``voice_dir``.

        Pass the folder as ``params["voice"]`` to ``synthesize``. The recording may have any
        sample rate (it is resampled to 16 kHz) and needs at least half a second of sound.
        """
        from mizuoto_engine_codeclm.voice import mono, speaker_embedding, write_voice

        ctx.check_cancel()
        samples = mono(audio.samples)
        if samples.size == 0:
            raise InvalidRequest(
                "audio: is empty; give a recording of the voice", {"field": "audio"}
            )
        embedding = speaker_embedding(samples, audio.sample_rate, "audio")
        seconds = round(samples.size / audio.sample_rate, 3)
        meta = {"source_sample_rate": audio.sample_rate, "seconds": seconds}
        files = write_voice(Path(voice_dir), embedding, meta)
        return {"files": files, "embedding": [float(v) for v in embedding], "seconds": seconds}

    def unload(self) -> None:
        self.handles = ()
        self._compiled.clear()

    def _frame_limit(self, request: SynthesisParams, text_bytes: int, prompt_length: int) -> int:
        """``params.max_frames``, or the text's own bound; either must fit in the context."""
        room = self.config.decoder.max_position_embeddings - prompt_length
        if request.max_frames is None:
            return min(self.config.generation.frame_bound(text_bytes), room)
        if request.max_frames > room:
            raise InvalidRequest(
                f"params.max_frames: {request.max_frames} frames do not fit after this text; "
                f"at most {room}",
                {"field": "params.max_frames"},
            )
        return request.max_frames

    def _compile(self, module: Module, name: str, ctx: RequestContext) -> Compiled | None:
        """``module`` behind torch.compile when the request asks (made once per model), or None."""
        if not ctx.compute.compile:
            return None
        if name not in self._compiled:
            from mizuoto_runtime import compile_module

            self._compiled[name] = compile_module(module, True, name)
        return self._compiled[name]


def _batched(items: Iterable[int], size: int) -> Iterator[list[int]]:
    """Lists of ``size`` items, the last one shorter (itertools.batched, before Python 3.12)."""
    batch: list[int] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
