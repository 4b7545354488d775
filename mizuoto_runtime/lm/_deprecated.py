"""CausalDecoder's deprecated arguments and methods, warned about in one wording."""

from __future__ import annotations

import warnings

GONE = "{} is deprecated and goes in the next release; decoders compute without it"


def deprecated_arguments(arguments: dict[str, object]) -> bool:
    """forward's old ``weights=`` and ``rotary=`` (lookups it now does itself, the same tensors
    and the same bits) are ignored; ``advance=False`` still leaves the cache's counters alone.
    Returns whether to advance the cache."""
    unknown = set(arguments) - {"weights", "rotary", "advance"}
    if unknown:
        raise TypeError(f"QwenDecoder.forward() got unexpected keyword arguments {sorted(unknown)}")
    for name in arguments:
        warnings.warn(
            GONE.format(f"QwenDecoder.forward({name}=)"), DeprecationWarning, stacklevel=3
        )
    return bool(arguments.get("advance", True))
