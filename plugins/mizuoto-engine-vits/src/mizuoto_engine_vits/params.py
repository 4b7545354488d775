"""The synthesize params this engine reads: declared once, here, for the manifest (plugin.py).

The host checks each request against ``PARAMS`` before the engine runs, so a bad value is an
InvalidRequest naming ``params.<name>``. A param left out takes the model's own value from its
config.json (``speaking_rate``, ``noise_scale``, ``noise_scale_duration``), as ``VitsModel``
does. Torch-free: plugin.py imports this module to list the engine.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from mizuoto_sdk import InvalidRequest, Param

PARAMS: tuple[Param, ...] = (
    Param(
        "speaking_rate",
        "float",
        None,
        minimum=0,
        maximum=100,
        exclusive_minimum=True,
        help="speech speed: durations are divided by it; none: the model's (config.json)",
    ),
    Param(
        "noise_scale",
        "float",
        None,
        minimum=0,
        maximum=10,
        help="scale of the prior's noise (variation in voice); none: the model's (0.667 in MMS)",
    ),
    Param(
        "noise_scale_duration",
        "float",
        None,
        minimum=0,
        maximum=10,
        help="scale of the duration noise (variation in rhythm); none: the model's (0.8 in MMS)",
    ),
    Param(
        "speaker",
        "int",
        None,
        minimum=0,
        help="speaker id of a multi-speaker model; none: no speaker embedding, as upstream",
    ),
)


@attrs.frozen(kw_only=True)
class SynthesisParams:
    """One request's settings, typed: ``PARAMS`` read into attributes of the same names; None
    means the model's own value."""

    speaking_rate: float | None
    noise_scale: float | None
    noise_scale_duration: float | None
    speaker: int | None

    @classmethod
    def from_params(cls, params: Mapping[str, object]) -> SynthesisParams:
        """The declared params from ``params``, each through its declaration: the host's checked
        values pass as they are; a caller that bypasses the host gets the same checks."""
        if not isinstance(params, Mapping):
            raise InvalidRequest(
                f"params: expected a mapping, got {type(params).__name__}", {"field": "params"}
            )
        return cls(**{p.name: p.check(params.get(p.name)) for p in PARAMS})  # type: ignore[arg-type]
