"""Attention: every attention call in the runtime goes through here.

``attention(q, k, v, site=SITE, ...)`` runs upstream's exact computation at ``SITE`` under
``compute.attention = "auto"`` and lets the other policies pick a faster kernel. Nothing in the
runtime sets torch.backends switches: they are process-wide, and calls run concurrently.
"""

from mizuoto_runtime.accel.kernels import KERNELS, AttentionCall, Kernel, installed
from mizuoto_runtime.accel.policy import POLICIES, attention, policy_of
from mizuoto_runtime.accel.sites import MaskInfo, Site, sdpa_reference

__all__ = [
    "KERNELS",
    "POLICIES",
    "AttentionCall",
    "Kernel",
    "MaskInfo",
    "Site",
    "attention",
    "installed",
    "policy_of",
    "sdpa_reference",
]
