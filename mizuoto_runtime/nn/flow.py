"""The flow-matching ODE solver of CosyVoice's and Matcha-TTS's decoders: fixed-step Euler from
noise to a mel, with classifier-free guidance.

Upstream (CosyVoice's ``ConditionalCFM``, Matcha-TTS's ``CFM``) draws the start as
``randn_like(mu) * temperature`` from the global generator, then steps ``x += dt * v`` over
``t_span = linspace(0, 1, n_timesteps + 1)`` (bent by ``1 - cos(t * pi / 2)`` under the cosine
schedule), ``dt`` re-read from the span after each step. With guidance the estimator sees the
batch twice, the second half with ``mu``, ``spks`` and ``cond`` zeroed, and the velocity is
``(1 + rate) * v - rate * v_unconditioned``. This module does the same operations in the same
order, drawing the start from the request's generator (or the one given): with a generator seeded
``s`` it equals upstream after ``torch.manual_seed(s)``, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from torch import Tensor

from mizuoto_runtime.context import current_context

Estimator = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor | None, Tensor | None], Tensor]
"""``estimator(x, mask, mu, t, spks, cond) -> velocity``, upstream's argument order."""


def time_span(
    n_timesteps: int,
    schedule: Literal["linear", "cosine"] = "linear",
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """The ``n_timesteps + 1`` times the solver steps through, from 0 to 1."""
    if isinstance(n_timesteps, bool) or not isinstance(n_timesteps, int) or n_timesteps < 1:
        raise ValueError(f"n_timesteps: expected an integer >= 1, got {n_timesteps!r}")
    if schedule not in ("linear", "cosine"):
        raise ValueError(f"schedule: expected 'linear' or 'cosine', got {schedule!r}")
    span = torch.linspace(0, 1, n_timesteps + 1, device=device, dtype=dtype)
    if schedule == "cosine":
        span = 1 - torch.cos(span * 0.5 * math.pi)
    return span


def flow_matching_euler(
    estimator: Estimator,
    mu: Tensor,
    mask: Tensor,
    n_timesteps: int,
    *,
    temperature: float = 1.0,
    spks: Tensor | None = None,
    cond: Tensor | None = None,
    cfg_rate: float = 0.0,
    schedule: Literal["linear", "cosine"] = "linear",
    generator: torch.Generator | None = None,
) -> Tensor:
    """The mel [B, C, T] the flow carries noise to, conditioned on ``mu`` [B, C, T].

    ``mask`` [B, 1, T] as upstream passes it; ``spks`` and ``cond`` go to the estimator as given
    (zeroed in the guidance half). ``cfg_rate`` 0 is Matcha-TTS's solver (one estimator call per
    step); above 0, CosyVoice's. The start is drawn from ``generator``, else from the bound
    request's generator for ``mu``'s device; outside a call, one of the two is required.
    """
    if mu.ndim != 3:
        raise ValueError(f"mu: expected [batch, channels, frames], got shape {tuple(mu.shape)}")
    if cfg_rate < 0:
        raise ValueError(f"cfg_rate: expected >= 0, got {cfg_rate!r}")
    if generator is None:
        context = current_context()
        if context is None:
            raise ValueError("generator: expected one outside a call (there is no request's)")
        generator = context.generator_for(mu.device)
    noise = torch.randn(mu.shape, generator=generator, device=mu.device, dtype=mu.dtype)
    x = noise * temperature
    span = time_span(n_timesteps, schedule, device=mu.device, dtype=mu.dtype)
    t, dt = span[0], span[1] - span[0]  # t stays 0-dim, as Matcha-TTS passes it
    batch = mu.shape[0]
    guided = cfg_rate > 0
    if guided:
        mask_in = torch.cat([mask, mask])
        mu_in = torch.cat([mu, torch.zeros_like(mu)])
        spks_in = None if spks is None else torch.cat([spks, torch.zeros_like(spks)])
        cond_in = None if cond is None else torch.cat([cond, torch.zeros_like(cond)])
    for step in range(1, len(span)):
        if guided:
            t_in = t.reshape(1).expand(2 * batch)  # CosyVoice's [2B] times
            velocity = estimator(torch.cat([x, x]), mask_in, mu_in, t_in, spks_in, cond_in)
            conditioned, unconditioned = torch.split(velocity, [batch, batch], dim=0)
            velocity = (1.0 + cfg_rate) * conditioned - cfg_rate * unconditioned
        else:
            velocity = estimator(x, mask, mu, t, spks, cond)
        x = x + dt * velocity
        t = t + dt
        if step < len(span) - 1:
            dt = span[step + 1] - t
    return x
