"""A streaming capability read whole: the non-streaming path of the host.

``LocalHandle.collect`` runs the engine's generator to its end inside one host step (one
inference-mode block with the context bound and the model held), and returns one AudioChunk. It
is the same request as a stream, without the caller's code between chunks, which makes it the
reference that a stream's concatenated chunks must equal.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from mizuoto_sdk.audio import host_chunk
from mizuoto_sdk.errors import EngineError, InvalidRequest
from mizuoto_sdk.types import AudioChunk

if TYPE_CHECKING:
    from mizuoto_sdk.host.local import LocalHandle
    from mizuoto_sdk.host.request import EngineRequest

_INPUTS = {"synthesize": ("text",), "convert": ("audio",), "edit": ("audio", "text")}


def collect(
    handle: LocalHandle,
    capability: str,
    arguments: tuple[object, ...],
    request: EngineRequest | None,
) -> AudioChunk:
    """The whole output of ``capability`` on ``arguments`` as one float32 mono chunk."""
    import numpy as np

    names = _INPUTS.get(capability)
    if names is None:
        raise InvalidRequest(
            f"capability: expected one of {', '.join(_INPUTS)}, got {capability!r}",
            {"field": "capability"},
        )
    if len(arguments) != len(names):
        raise InvalidRequest(
            f"{capability} takes {', '.join(names)}; got {len(arguments)} argument(s)",
            {"field": names[0]},
        )
    call = handle._call(capability, request)
    checked = [
        handle._text(value) if name == "text" else handle._audio(value)
        for name, value in zip(names, arguments, strict=True)
    ]

    def whole() -> AudioChunk:
        # The engine this call runs on: a call that begins may have loaded the model again.
        chunks = iter(getattr(call.loaded, capability)(*checked, call.ctx.params, call.ctx))
        try:
            converted = [host_chunk(chunk, index) for index, chunk in enumerate(chunks)]
        finally:
            close = getattr(chunks, "close", None)
            if close is not None:
                close()
        if not converted:
            raise EngineError(f"{capability} yielded no chunk")
        rates = {c.sample_rate for c in converted}
        if len(rates) > 1:
            raise EngineError(f"{capability} yielded chunks at {sorted(rates)} Hz: one rate only")
        return AudioChunk(np.concatenate([c.samples for c in converted]), converted[0].sample_rate)

    with call:
        call.check_cancel()
        result = call.step(whole)
        call.check_cancel()
    return result
