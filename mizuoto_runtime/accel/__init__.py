"""Attention and hardware switches: every attention call in the runtime goes through here.

``attention(q, k, v, site=SITE, ...)`` runs upstream's exact computation at ``SITE`` under
``compute.attention = "auto"`` and lets the other policies pick a faster kernel;
``features.apply`` scopes the torch.backends switches that ``compute.fast`` asks for.
"""

from mizuoto_runtime.accel import features
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
    "features",
    "installed",
    "policy_of",
    "sdpa_reference",
]
