"""The CSM engine: load the checkpoint folder, speak a turn (streamed), prepare voices.

``synthesize`` renders the turns (a voice's context turn, then the text as ``[speaker]text``)
through the folder's chat template (prompt.py), embeds them as upstream merges text and audio,
lets the backbone and depth decoder write code frames (frames.py), and decodes them with Mimi:
once at the end with ``chunk_frames=0`` (the audio ``generate(output_audio=True)`` returns, bit
for bit), or every ``chunk_frames`` frames through the codec's stream decoder. ``prepare_voice``
stores a recording's Mimi codes with its transcript and speaker (voice.py).

This module is what the manifest's ``implementation`` names, so it imports neither torch nor the
modules that do until a model is loaded.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from mizuoto_engine_csm.params import SynthesisParams
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
    import torch

    from mizuoto_engine_csm.model import CsmNetworks
    from mizuoto_engine_csm.prompt import PromptBuilder
    from mizuoto_engine_csm.voice import Voice


class CsmEngine(Engine):
    def load(self, spec: LoadSpec, runtime: Runtime, ctx: RequestContext) -> LoadedEngine:
        import torch

        from mizuoto_engine_csm.config import CsmConfig
        from mizuoto_engine_csm.model import load_networks
        from mizuoto_engine_csm.prompt import PromptBuilder

        if spec.model_dir is None:
            raise EngineError(f"model {spec.model_id!r} has no files to load")
        config = CsmConfig.from_folder(spec.model_dir)
        prompt = PromptBuilder.from_folder(
            spec.model_dir, config.audio_token_id, config.audio_eos_token_id
        )
        name = f"csm/{spec.model_id}"
        networks = load_networks(
            spec.model_dir, config, dtype=getattr(torch, spec.dtype), device=spec.device, name=name
        )
        return LoadedCsm(spec, networks, prompt, name)


class LoadedCsm(LoadedEngine):
    """The backbone, depth decoder, embeddings and codec, each in its ModelHandle."""

    handles: tuple[ModelHandle, ...]

    def __init__(
        self, spec: LoadSpec, networks: CsmNetworks, prompt: PromptBuilder, name: str
    ) -> None:
        self.spec, self.config, self.prompt = spec, networks.config, prompt
        self._codec = networks.codec
        self.handles = (
            ModelHandle(
                networks.backbone, name=f"{name}:backbone", load_device=spec.device, kind="sequence"
            ),
            ModelHandle(
                networks.depth,
                name=f"{name}:depth_decoder",
                load_device=spec.device,
                kind="sequence",
            ),
            # One part: the embeddings and heads are read a row or a matrix at a time.
            ModelHandle(
                networks.parts, name=f"{name}:embeddings", load_device=spec.device, units=()
            ),
            # Mimi's three parts, named after this model (the codec names them after itself).
            *(
                ModelHandle(
                    handle.module,
                    name=f"{name}:codec_{part}",
                    load_device=spec.device,
                    units=handle.units,
                )
                for part, handle in zip(
                    ("encoder", "decoder", "quantizer"), networks.codec.handles, strict=True
                )
            ),
        )

    @property
    def networks(self) -> CsmNetworks:
        from mizuoto_engine_csm.model import CsmNetworks

        backbone, depth, parts = (h.module for h in self.handles[:3])
        return CsmNetworks(self.config, backbone, depth, parts, self._codec)  # type: ignore[arg-type]

    @property
    def voices_dir(self) -> Path | None:
        """The model's own voices: a ``voices`` folder among its files."""
        return None if self.spec.model_dir is None else self.spec.model_dir / "voices"

    def describe(self) -> Mapping[str, object]:
        from mizuoto_engine_csm import voice

        networks = self.networks
        return {
            "model": self.spec.model_id,
            "device": self.spec.device,
            "dtype": self.spec.dtype,
            "sample_rate": self._sample_rate,
            "frame_rate": self._codec.frame_rate,
            "codebooks": self.config.num_codebooks,
            "parameters": {
                "backbone": sum(p.numel() for p in networks.backbone.parameters()),
                "depth_decoder": sum(p.numel() for p in networks.depth.parameters()),
                "embeddings": sum(p.numel() for p in networks.parts.parameters()),
            },
            "generation": {
                "max_frames": self.config.max_new_tokens,
                "temperature": self.config.sampling.temperature,
                "top_k": self.config.sampling.top_k,
            },
            "limits": {
                "context_tokens": self.config.backbone.max_position_embeddings,
                "voice_seconds": voice.MAX_SECONDS,
                "voice_sample_rate": [voice.MIN_RATE, voice.MAX_RATE],
            },
        }

    @property
    def _sample_rate(self) -> int:
        return int(self.config.codec.get("sampling_rate", 24_000))

    def synthesize(
        self, text: str, params: Mapping[str, object], ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        import torch

        from mizuoto_engine_csm.frames import frames, sampling_params
        from mizuoto_engine_csm.prompt import Turn, check_text
        from mizuoto_engine_csm.voice import read_voice
        from mizuoto_runtime import SamplingParams, find_voice, voice_roots

        request = SynthesisParams.from_params(params)
        check_text(text, "text")
        voice = None
        if request.voice is not None:  # only inside the model's voices and voices.roots
            roots = voice_roots(ctx.settings, self.voices_dir)
            found = find_voice(request.voice, roots, suffixes=())
            voice = read_voice(found, self.config.num_codebooks, self._codec.codebook_size)
        turns = [Turn(request.speaker, text)]
        if voice is not None:
            turns.insert(0, Turn(voice.speaker, voice.transcript, voice.frames))
        ids = self.prompt.ids(turns)
        limit = self._frame_limit(request, len(ids))
        networks = self.networks
        device = networks.parts.lm_head.weight.device
        with torch.inference_mode():
            prompt = self._embed(networks, ids, voice, device)
        main = self.config.sampling
        sampling = SamplingParams(
            do_sample=main.do_sample,
            temperature=main.temperature if request.temperature is None else request.temperature,
            top_k=main.top_k if request.top_k is None else request.top_k,
            top_p=main.top_p,
            min_p=main.min_p,
        )
        ctx.applied["csm"] = {
            "voice": voice is not None,
            "speaker": request.speaker,
            "max_frames": limit,
            "prompt_tokens": len(ids),
            "temperature": sampling.temperature,
            "top_k": sampling.top_k,
        }
        codes = frames(
            networks,
            prompt,
            sampling=sampling,
            depth_sampling=sampling_params(self.config.depth_sampling),
            max_frames=limit,
            ctx=ctx,
        )
        yield from self._audio(codes, request.chunk_frames, limit, ctx)

    def _audio(
        self, codes: Iterator[torch.Tensor], chunk_frames: int, limit: int, ctx: RequestContext
    ) -> Iterator[AudioChunk]:
        """Mimi's audio of ``codes``: at the end (chunk_frames 0) or every chunk_frames."""
        import torch

        rate = self._sample_rate
        written: list[torch.Tensor] = []
        pending: list[torch.Tensor] = []  # frames not yet given to the stream
        stream = self._codec.stream_decoder() if chunk_frames else None
        spoken = False
        for frame in codes:
            written.append(frame)
            pending.append(frame)
            ctx.progress(len(written), None, f"frames (at most {limit})")
            if stream is not None and len(pending) == chunk_frames:
                samples = stream.decode(torch.stack(pending, dim=1)[None])[0, 0]  # [n * hop]
                pending = []
                if samples.shape[-1]:  # the stream holds its first frames back until it can
                    spoken = True
                    yield AudioChunk(samples.float().cpu().numpy(), rate, {"frames": len(written)})
        ctx.progress(len(written), len(written), "frames")
        ctx.applied["csm"]["frames"] = len(written)
        if stream is not None and spoken:
            if pending:
                samples = stream.decode(torch.stack(pending, dim=1)[None])[0, 0]
                yield AudioChunk(samples.float().cpu().numpy(), rate, {"frames": len(written)})
            return
        # chunk_frames 0, or a stream that never spoke: one decode of every frame, as upstream
        if written:
            samples = self._codec.decode(torch.stack(written, dim=1)[None])[0, 0]
        else:  # the first frame ended the utterance
            samples = torch.zeros(0)
        yield AudioChunk(samples.float().cpu().numpy(), rate, {"frames": len(written)})

    def _embed(
        self, networks: CsmNetworks, ids: list[int], voice: Voice | None, device: torch.device
    ) -> torch.Tensor:
        """The prompt's embeddings [1, L, hidden], as upstream merges text and audio."""
        import torch

        parts = networks.parts
        tokens = torch.tensor([ids], dtype=torch.long, device=device)
        embeds = parts.embed_text_tokens(tokens)  # [1, L, hidden]
        if voice is None:
            return embeds
        codes = torch.tensor(voice.codes, dtype=torch.long, device=device).T[None]  # [1, F, K]
        embeds[tokens == self.config.audio_token_id] = parts.frame_embeds(codes)[0]
        end = torch.full_like(codes[:, :1], self.config.codebook_eos_token_id)  # [1, 1, K]
        end_mask = tokens == self.config.audio_eos_token_id
        embeds[end_mask] = parts.frame_embeds(end).squeeze(1).repeat(int(end_mask.sum()), 1)
        return embeds

    def _frame_limit(self, request: SynthesisParams, prompt_length: int) -> int:
        """``params.max_frames`` or the model's max_new_tokens; prompt and frames must fit."""
        room = self.config.backbone.max_position_embeddings - prompt_length
        limit = self.config.max_new_tokens if request.max_frames is None else request.max_frames
        if room < 1:
            raise InvalidRequest(
                f"text: the prompt takes {prompt_length} tokens of the backbone's "
                f"{self.config.backbone.max_position_embeddings}; shorten the text or the voice",
                {"field": "text"},
            )
        if limit > room:
            if request.max_frames is None:
                return room
            raise InvalidRequest(
                f"params.max_frames: {limit} frames do not fit after this prompt; at most {room}",
                {"field": "params.max_frames"},
            )
        return limit

    def prepare_voice(
        self, audio: AudioChunk, voice_dir: Path, params: Mapping[str, object], ctx: RequestContext
    ) -> Mapping[str, object]:
        """Write ``voice.json`` (the recording's Mimi codes, transcript and speaker) into
        ``voice_dir``; ``params["transcript"]`` holds the words spoken (without them the context
        turn has none, with a warning), ``params["speaker"]`` the speaker id."""
        import torch

        from mizuoto_engine_csm.prompt import check_text
        from mizuoto_engine_csm.voice import (
            Voice,
            check_recording,
            check_transcript,
            codes_of,
            mono,
            write_voice,
        )
        from mizuoto_runtime import resample

        ctx.check_cancel()
        request = SynthesisParams.from_params(params)
        transcript = check_transcript(request.transcript)
        if transcript.strip():
            check_text(transcript, "params.transcript")
        else:
            ctx.warn(
                "params.transcript: none given; the voice's context turn has no words, and CSM "
                "clones a voice better from its recording and transcript together"
            )
        samples = check_recording(mono(audio.samples), audio.sample_rate)
        if audio.sample_rate != self._sample_rate:
            samples = resample(samples, audio.sample_rate, self._sample_rate)
        device = self.networks.parts.lm_head.weight.device
        waveform = torch.from_numpy(samples.copy())[None, None].to(device)  # [1, 1, T]
        codes = self._codec.encode(waveform)[0]  # [K, frames]
        voice = Voice(request.speaker, transcript, codes_of(codes.tolist()))
        seconds = round(samples.size / self._sample_rate, 3)
        meta = {"source_sample_rate": audio.sample_rate, "seconds": seconds}
        files = write_voice(Path(voice_dir), voice, meta)
        return {
            "files": files,
            "frames": voice.frames,
            "speaker": voice.speaker,
            "seconds": seconds,
        }

    def unload(self) -> None:
        self.handles = ()
