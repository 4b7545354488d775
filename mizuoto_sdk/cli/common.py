"""What every command shares: the usage error (exit 2) and the codes that count as usage."""

from __future__ import annotations

USAGE_CODES = {"engine_not_found", "invalid_request", "capability_not_supported"}


class Usage(Exception):
    """A mistake in how the command was called: printed, exit 2."""


def mib(count: object) -> str:
    return f"{int(count) / 2**20:.1f} MiB"  # type: ignore[call-overload]  # a byte count
