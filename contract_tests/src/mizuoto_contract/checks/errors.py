"""Checks on inputs and errors: inputs untouched, typed errors for what the engine cannot do."""

from __future__ import annotations

import copy
import inspect
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from mizuoto_contract.outcome import Fail
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import SEED, Subject, sample_audio
from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import AudioChunk, EngineError, LoadedEngine
from mizuoto_sdk.manifest import CAPABILITIES

UNKNOWN_OP = "mizuoto-contract.no-such-operation"


def _drain(subject: Subject, ctx: RequestContext, returned: object) -> None:
    if inspect.isgenerator(returned) or hasattr(returned, "__next__"):
        with subject.direct(ctx):
            for _ in returned:  # type: ignore[attr-defined]  # an iterator: checked above
                pass


def not_mutated(subject: Subject) -> None:
    handle = subject.load()
    # Only params the engine can expect (no invented keys: an engine may rightly refuse those).
    params = subject.params({"seed": SEED})
    expected = copy.deepcopy(params)
    audio = sample_audio()
    audio.samples.setflags(write=False)  # read-only input must be accepted, too
    original = audio.samples.copy()
    ctx = subject.context(SEED)
    arguments = {
        "synthesize": (subject.sentence,),
        "convert": (audio,),
        "edit": (audio, subject.sentence),
    }[subject.capability or "synthesize"]
    method = getattr(handle.loaded_engine, subject.capability or "synthesize")
    with subject.direct(ctx):
        returned = method(*arguments, params, ctx)
    _drain(subject, ctx, returned)
    _unchanged(subject.capability or "synthesize", params, expected, audio.samples, original)
    if "prepare_voice" in subject.manifest.capabilities and subject.first_pass:
        # A writable recording: an engine that normalises it in place changes the caller's.
        recording = sample_audio()
        voices = tempfile.TemporaryDirectory(prefix="mizuoto-contract-voice-")
        engine = handle.loaded_engine
        assert engine is not None  # load() leaves the model loaded
        with voices as folder, subject.direct(ctx):  # an empty folder, as the host gives
            engine.prepare_voice(recording, Path(folder), params, ctx)
        _unchanged("prepare_voice", params, expected, recording.samples, original)


def _unchanged(
    capability: str, params: object, expected: object, samples: Any, original: Any
) -> None:
    import numpy as np

    if params != expected:
        raise Fail(
            f"params left as {capability} was passed them", f"{expected!r} became {params!r}"
        )
    if not np.array_equal(samples, original):
        raise Fail(f"input audio left as {capability} was given it", "its samples changed")


def _loaded(subject: Subject) -> LoadedEngine:
    loaded = subject.load().loaded_engine
    if loaded is None:  # load() leaves the model loaded
        raise Fail("a loaded engine after load", "none")
    return loaded


def _raises_code(
    subject: Subject, ctx: RequestContext, call: Callable[[], object], code: str
) -> tuple[str, str | None] | None:
    """None when ``call`` (or the stream it returns) raises EngineError ``code``, else what
    happened instead and where in the engine's code."""
    try:
        with subject.direct(ctx):
            returned = call()
        _drain(subject, ctx, returned)
    except EngineError as error:
        if error.code == code:
            return None
        return f"EngineError code {error.code!r}", subject.where(error)
    except Exception as error:
        return f"{type(error).__name__}: {error}", subject.where(error)
    return "no error", None


def unsupported(subject: Subject) -> None:
    loaded, ctx = _loaded(subject), subject.context(SEED)
    audio, params = sample_audio(), subject.params({"seed": SEED})
    calls = {
        "synthesize": lambda: loaded.synthesize("hello", params, ctx),
        "convert": lambda: loaded.convert(audio, params, ctx),
        "edit": lambda: loaded.edit(audio, "hello", params, ctx),
        "prepare_voice": lambda: loaded.prepare_voice(audio, _nowhere(), params, ctx),
        "call": lambda: loaded.call(UNKNOWN_OP, {}, ctx),
    }
    declared = set(subject.manifest.capabilities)
    for capability in CAPABILITIES:
        if capability in declared and capability != "call":
            continue
        seen = _raises_code(subject, ctx, calls[capability], "capability_not_supported")
        if seen is not None:
            what = f"call({UNKNOWN_OP!r})" if capability == "call" else capability
            raise Fail(f"{what} to raise Unsupported (capability_not_supported)", *seen)


def _nowhere():
    from pathlib import Path

    return Path("/nonexistent/mizuoto-contract-voice")


def invalid_input(subject: Subject) -> None:
    import numpy as np

    loaded, ctx = _loaded(subject), subject.context(SEED)
    params = subject.params({"seed": SEED})
    empty = AudioChunk(np.zeros(0, np.float32), 16_000)
    cases: dict[str, tuple[str, Callable[[], object]]] = {
        "synthesize": ("synthesize('')", lambda: loaded.synthesize("", params, ctx)),
        "convert": ("convert(empty audio)", lambda: loaded.convert(empty, params, ctx)),
        "edit": ("edit(audio, '')", lambda: loaded.edit(sample_audio(), "", params, ctx)),
    }
    checked = [subject.capability] if subject.capability in cases else []
    with tempfile.TemporaryDirectory(prefix="mizuoto-contract-voice-") as folder:
        if "prepare_voice" in subject.manifest.capabilities and subject.first_pass:
            voice = Path(folder)  # an empty folder, as the host gives
            cases["prepare_voice"] = (
                "prepare_voice(empty audio)",
                lambda: loaded.prepare_voice(empty, voice, params, ctx),
            )
            checked.append("prepare_voice")
        for capability in checked:
            what, call = cases[capability]
            seen = _raises_code(subject, ctx, call, "invalid_request")
            if seen is not None:
                raise Fail(f"{what} to raise InvalidRequest (invalid_request)", *seen)


CHECKS = (
    Check(
        "inputs.not_mutated",
        "Inputs (params, audio) are left as passed, by every capability (prepare_voice too); "
        "read-only input works.",
        "Callers reuse their inputs for retries and other engines.",
        "Copy before changing anything you were given.",
        "core",
        not_mutated,
        ("streaming",),
        requires=("stream.chunks_valid",),
    ),
    Check(
        "errors.unsupported",
        "Capabilities the manifest does not declare, and unknown operations, raise Unsupported.",
        "The host maps Unsupported to capability_not_supported; anything else looks like a crash.",
        "Declare every capability you implement; leave the others to LoadedEngine's defaults.",
        "core",
        unsupported,
    ),
    Check(
        "errors.invalid_input",
        "Empty input raises InvalidRequest (code invalid_request), not another exception, in "
        "every capability (prepare_voice too).",
        "Clients show invalid_request errors to the user as their mistake, with the field.",
        "Check inputs first and raise InvalidRequest(message, {'field': ...}).",
        "core",
        invalid_input,
        ("streaming",),
    ),
)
