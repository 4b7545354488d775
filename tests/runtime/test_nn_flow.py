"""The flow-matching Euler solver against upstream's, re-derived below as CosyVoice's
``ConditionalCFM`` and Matcha-TTS's ``CFM`` publish it (their ``forward`` and ``solve_euler``),
run on the global generator after ``torch.manual_seed(seed)``; ours draws from a generator seeded
the same and must give the same mel, bit for bit."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mizuoto_runtime.nn.flow import flow_matching_euler, time_span


class Estimator(nn.Module):
    """A small velocity field of upstream's signature: every input changes the output."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv = nn.Conv1d(3 * channels + 1, channels, 3, padding=1)

    def forward(self, x, mask, mu, t, spks, cond):
        frames = x.shape[-1]
        time = (
            t.reshape(-1, 1, 1).expand(x.shape[0], 1, frames)
            if t.ndim
            else t.expand(x.shape[0], 1, frames)
        )
        speaker = (
            spks[:, :, None].expand(-1, -1, frames) if spks is not None else torch.zeros_like(x)
        )
        inputs = torch.cat([x, mu, speaker + (cond if cond is not None else 0), time], dim=1)
        return torch.tanh(self.conv(inputs)) * mask


def upstream(estimator, mu, mask, n_timesteps, temperature, spks, cond, cfg_rate, scheduler):
    """CosyVoice's ConditionalCFM (cfg_rate > 0) or Matcha-TTS's CFM (cfg_rate 0), as published."""
    z = torch.randn_like(mu) * temperature
    t_span = torch.linspace(0, 1, n_timesteps + 1, device=mu.device, dtype=mu.dtype)
    if scheduler == "cosine":
        t_span = 1 - torch.cos(t_span * 0.5 * torch.pi)
    x = z
    t, _, dt = t_span[0], t_span[-1], t_span[1] - t_span[0]
    sol = []
    for step in range(1, len(t_span)):
        if cfg_rate > 0:
            b = x.size(0)
            x_in = torch.cat([x, x])
            mask_in = torch.cat([mask, mask])
            mu_in = torch.cat([mu, torch.zeros_like(mu)])
            t_in = t.unsqueeze(0).repeat(2 * b)
            spks_in = torch.cat([spks, torch.zeros_like(spks)])
            cond_in = torch.cat([cond, torch.zeros_like(cond)])
            dphi_dt = estimator(x_in, mask_in, mu_in, t_in, spks_in, cond_in)
            dphi_dt, cfg_dphi_dt = torch.split(dphi_dt, [b, b], dim=0)
            dphi_dt = (1.0 + cfg_rate) * dphi_dt - cfg_rate * cfg_dphi_dt
        else:
            dphi_dt = estimator(x, mask, mu, t, spks, cond)
        x = x + dt * dphi_dt
        t = t + dt
        sol.append(x)
        if step < len(t_span) - 1:
            dt = t_span[step + 1] - t
    return sol[-1]


@pytest.mark.parametrize("cfg_rate", [0.0, 0.7])
@pytest.mark.parametrize("schedule", ["linear", "cosine"])
@pytest.mark.parametrize("seed", [0, 7])
def test_equals_upstream_for_the_same_seed(cfg_rate, schedule, seed):
    channels, frames, batch = 6, 11, 2
    data = torch.Generator().manual_seed(100 + seed)
    with torch.no_grad():
        estimator = Estimator(channels)
        for p in estimator.parameters():
            p.copy_(torch.randn(p.shape, generator=data) * 0.3)
        mu = torch.randn(batch, channels, frames, generator=data)
        mask = torch.ones(batch, 1, frames)
        mask[1, :, 8:] = 0
        spks = torch.randn(batch, channels, generator=data)
        cond = torch.randn(batch, channels, frames, generator=data)
        args = (estimator, mu, mask, 5, 0.8, spks, cond, cfg_rate, schedule)
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            expected = upstream(*args)
        ours = flow_matching_euler(
            estimator,
            mu,
            mask,
            5,
            temperature=0.8,
            spks=spks,
            cond=cond,
            cfg_rate=cfg_rate,
            schedule=schedule,
            generator=torch.Generator().manual_seed(seed),
        )
    assert torch.equal(ours, expected)


def test_the_cosine_span_bends_time_toward_the_start():
    span = time_span(4, "cosine")
    assert span[0] == 0 and math.isclose(float(span[-1]), 1.0, abs_tol=1e-7)
    assert torch.all(span.diff() > 0) and span[1] < 0.25  # smaller first steps


def test_bad_arguments_name_themselves():
    estimator = Estimator(2)
    mu, mask = torch.zeros(1, 2, 3), torch.ones(1, 1, 3)
    with pytest.raises(ValueError, match="n_timesteps"):
        flow_matching_euler(estimator, mu, mask, 0, generator=torch.Generator())
    with pytest.raises(ValueError, match="mu: expected"):
        flow_matching_euler(estimator, mu[0], mask, 2, generator=torch.Generator())
    with pytest.raises(ValueError, match="generator"):  # no request's generator outside a call
        flow_matching_euler(estimator, mu, mask, 2)
