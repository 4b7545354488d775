"""The good engine's model: one note per character, its loudness from one linear layer."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from mizuoto_broken.base import SAMPLE_RATE
from mizuoto_runtime import ops

NOTE = 480  # samples per character: 30 ms
STEPS = 24


class Notes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.loudness = ops.default.Linear(STEPS, 1)

    def forward(self, steps: Tensor, jitter: Tensor) -> Tensor:
        """steps [chars] (semitones), jitter [chars] (near 1) -> samples [chars * NOTE]."""
        notes = nn.functional.one_hot(steps, STEPS).float()  # [chars, STEPS]
        gain = torch.sigmoid(self.loudness(notes))  # [chars, 1]
        pitch = 220.0 * torch.pow(2.0, steps / 12) * jitter  # [chars]
        t = torch.arange(NOTE, device=steps.device) / SAMPLE_RATE  # [NOTE]
        envelope = torch.hann_window(NOTE, periodic=False, device=steps.device)
        # [chars, NOTE] -> [chars * NOTE]
        return (0.3 * gain * envelope * torch.sin(2 * torch.pi * pitch[:, None] * t)).reshape(-1)


def build(device: str, seed: int) -> Notes:
    """The model, its weights drawn from a private generator seeded ``seed`` (no checkpoint)."""
    model = ops.init_random(Notes(), torch.Generator().manual_seed(seed))
    return model.to(device).eval()
