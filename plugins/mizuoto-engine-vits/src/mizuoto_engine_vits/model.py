"""VITS as transformers' ``VitsModel`` runs it at inference: text ids in, a waveform out.

The forward is upstream's: the text encoder gives each id a prior (means, log-variances); the
duration predictor says how many frames each id lasts; each prior is repeated that many times,
sampled with the prior noise, inverted through the flow and decoded to audio. The two random
draws (duration noise, then prior noise) come from the generators passed in, in upstream's
order, shapes and devices, so that with a generator seeded ``s`` the waveform is, bit for bit,
``VitsModel(**tokenizer(text)).waveform`` after ``torch.manual_seed(s)`` (float32, CPU).

One change of method, not of result: upstream expands the priors with a 0/1 alignment matrix
and a matmul; each output is one prior value times one plus exact zeros, which is that value,
so ``repeat_interleave`` gives the same numbers without the frames-by-ids matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from mizuoto_engine_vits.config import VitsConfig
from mizuoto_engine_vits.decoder import VitsHifiGan
from mizuoto_engine_vits.duration import VitsDurationPredictor, VitsStochasticDurationPredictor
from mizuoto_engine_vits.flows import VitsResidualCouplingBlock, fold_weight_norm
from mizuoto_engine_vits.text_encoder import VitsTextEncoder
from mizuoto_runtime.ops import default
from mizuoto_runtime.weights.loading import load_into

TRAINING_ONLY = ("posterior_encoder.*", "duration_predictor.post_*")
"""Checkpoint tensors that only training uses (the posterior encoder, the duration predictor's
posterior flows): present in every checkpoint, never built here."""

MAX_FRAMES = 1 << 20
"""The most latent frames one text may ask for (over four hours at 16 kHz): past it, the
durations are not a real utterance and upstream would try to allocate them all."""


class DurationError(ValueError):
    """The durations ask for more than ``MAX_FRAMES`` frames (or are not finite)."""


@dataclass(frozen=True)
class Controls:
    """What a request may change: upstream's ``speaking_rate`` argument, ``noise_scale`` and
    ``noise_scale_duration`` (attributes there), and the speaker id (None: no speaker embedding,
    as upstream without ``speaker_id``)."""

    speaking_rate: float
    noise_scale: float
    noise_scale_duration: float
    speaker: int | None = None


class VitsModel(nn.Module):
    """The inference half of VITS; submodule names are upstream's, so its checkpoints load as
    they are (``posterior_encoder`` and the posterior flows are skipped)."""

    def __init__(self, config: VitsConfig, **factory: Any) -> None:
        super().__init__()
        self.config = config
        self.text_encoder = VitsTextEncoder(config, **factory)
        self.flow = VitsResidualCouplingBlock(config, **factory)
        self.decoder = VitsHifiGan(config, **factory)
        self.duration_predictor: nn.Module
        if config.use_stochastic_duration_prediction:
            self.duration_predictor = VitsStochasticDurationPredictor(config, **factory)
        else:
            self.duration_predictor = VitsDurationPredictor(config, **factory)
        if config.num_speakers > 1:
            size = config.speaker_embedding_size
            self.embed_speaker = default.Embedding(config.num_speakers, size, **factory)

    @property
    def device(self) -> torch.device:
        return self.text_encoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.text_encoder.embed_tokens.weight.dtype

    def execution_order(self) -> list[nn.Module]:
        """The parts in the order a forward runs them (a memory manager's streaming units)."""
        return [self.text_encoder, self.duration_predictor, self.flow, *self.decoder_units()]

    def decoder_units(self) -> list[nn.Module]:
        return [self.decoder.conv_pre, *self.decoder.execution_order(), self.decoder.conv_post]

    def forward(
        self,
        ids: Tensor,
        controls: Controls,
        *,
        duration_generator: torch.Generator,
        prior_generator: torch.Generator,
    ) -> Tensor:
        """``ids [1, T]`` (T >= 1) -> waveform ``[1, frames * hop_length]``.

        ``duration_generator`` is a CPU generator (upstream draws the duration noise there on
        every device); ``prior_generator`` is on the model's device.
        """
        config = self.config
        mask = torch.ones_like(ids).unsqueeze(-1).to(self.dtype)  # [1, T, 1]
        speaker = None
        if config.num_speakers > 1 and controls.speaker is not None:
            index = torch.full((1,), controls.speaker, device=self.device)
            speaker = self.embed_speaker(index).unsqueeze(-1)  # [1, embedding, 1]
        hidden, means, log_variances = self.text_encoder(ids, mask)
        hidden, mask = hidden.transpose(1, 2), mask.transpose(1, 2)  # [1, hidden, T], [1, 1, T]
        if isinstance(self.duration_predictor, VitsStochasticDurationPredictor):
            log_duration = self.duration_predictor(
                hidden,
                mask,
                speaker,
                noise_scale=controls.noise_scale_duration,
                generator=duration_generator,
            )
        else:
            log_duration = self.duration_predictor(hidden, mask, speaker)
        length_scale = 1.0 / controls.speaking_rate
        duration = torch.ceil(torch.exp(log_duration) * mask * length_scale)  # [1, 1, T]
        total = float(duration.sum())
        if not total <= MAX_FRAMES:  # also NaN
            raise DurationError(
                f"the duration predictor asked for {total} frames, more than {MAX_FRAMES}"
            )
        if total >= 1:
            counts = duration[0, 0].long()
            means = means.repeat_interleave(counts, dim=1)  # [1, frames, flow]
            log_variances = log_variances.repeat_interleave(counts, dim=1)
        else:  # upstream keeps one frame, whose alignment row is all zeros
            means = torch.zeros_like(means[:, :1])
            log_variances = torch.zeros_like(log_variances[:, :1])
        means, log_variances = means.transpose(1, 2), log_variances.transpose(1, 2)
        noise = torch.randn_like(means, generator=prior_generator)  # upstream's layout, too
        latents = means + noise * torch.exp(log_variances) * controls.noise_scale
        frame_mask = torch.ones_like(latents[:, :1])  # [1, 1, frames]
        latents = self.flow(latents, frame_mask, speaker)
        return self.decoder(latents * frame_mask, speaker).squeeze(1)


def build(
    config: VitsConfig, state_dict: dict[str, Tensor], *, device: str, dtype: torch.dtype
) -> VitsModel:
    """The model, built on ``meta`` and filled strictly from ``state_dict`` (weight-norm pairs
    folded, training-only tensors skipped); ``load_into`` names every bad key."""
    with torch.device("meta"):
        model = VitsModel(config, dtype=dtype)
    load_into(model, fold_weight_norm(state_dict), cast=True, ignore=TRAINING_ONLY)
    return model.to(device).eval()


def load_model(
    folder: str | PathLike[str], *, device: str = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[VitsConfig, VitsModel]:
    """The config and model of a ``save_pretrained`` / Hub folder (config.json, safetensors)."""
    from mizuoto_runtime.nn.loaders import read_config
    from mizuoto_runtime.weights.checkpoint import load_state_dict

    config = VitsConfig.from_dict(read_config(folder))
    return config, build(config, load_state_dict(Path(folder)), device=device, dtype=dtype)
