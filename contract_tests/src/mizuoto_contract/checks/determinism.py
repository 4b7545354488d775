"""Checks that a seed decides the output: across loads, calls, processes and global RNG use."""

from __future__ import annotations

import contextlib
import random
import sys
from collections.abc import Iterator

from mizuoto_contract import isolated
from mizuoto_contract.checks.concurrency import concurrent
from mizuoto_contract.checks.state import STREAM_OUTPUT
from mizuoto_contract.inputs import Example, explore, other_text, same_take
from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import SEED, Subject, differ, digest, join
from mizuoto_sdk.host import EngineRequest, LocalModel


@contextlib.contextmanager
def _globals_reseeded() -> Iterator[None]:
    """The global torch/numpy/random generators reseeded and drawn from; restored afterwards.

    torch's only once imported: an engine that never imports torch cannot read its generator.
    """
    import numpy as np

    torch = sys.modules.get("torch")
    saved = np.random.get_state(), random.getstate()
    torch_state = torch.get_rng_state() if torch is not None else None
    try:
        # allowed: the check perturbs the global RNGs on purpose and restores them below
        if torch is not None:
            torch.manual_seed(987654321)  # allowed: restored in finally
            torch.rand(7)
        np.random.seed(98765)  # allowed: restored in finally
        random.seed(98765)  # allowed: restored in finally
        np.random.rand(7), random.random()
        yield
    finally:
        if torch is not None:
            torch.set_rng_state(torch_state)
        np.random.set_state(saved[0])
        random.setstate(saved[1])


def _texts(subject: Subject, turn: int) -> tuple[str, str]:
    """The two texts a comparing check speaks: the sample text's first sentence and a short
    text of another kind (``turn`` picks which)."""
    return subject.sentence, other_text(turn)


def _takes(subject: Subject, handle: LocalModel, texts: tuple[str, ...], seed: int) -> list[bytes]:
    """The audio of each text with ``seed`` through the host (b"" for a text the engine refuses
    with InvalidRequest, which it may do for any but the sample text)."""
    return [subject.speak(handle, Example(text, seed)) or b"" for text in texts]


def fresh_loads(subject: Subject) -> None:
    texts = _texts(subject, 0)
    first = _takes(subject, subject.load(), texts, SEED)
    second = _takes(subject, subject.load(), texts, SEED)
    for text, one, other in zip(texts, first, second, strict=True):
        if one != other:
            raise Fail(
                "bitwise-identical audio from two fresh loads with one seed",
                f"{differ(one, other)}, for {text!r}",
            )


def applied_seed(subject: Subject) -> None:
    handle = subject.load()
    text = subject.sentence
    request = EngineRequest()  # no seed: the host draws one and reports it
    unseeded = join(list(subject.stream(handle, request, text)))
    seed = request.applied.get("seed")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise Fail(
            "the seed an unseeded call used, as an int in request.applied['seed']", repr(seed)
        )
    replay = subject.audio(handle, seed, text)
    if replay != unseeded:
        raise Fail(
            f"the unseeded call's audio again from a call with the seed it reported ({seed})",
            differ(unseeded, replay),
        )


def same_handle(subject: Subject) -> None:
    handle = subject.load()
    # The explored examples, against what stream.chunks_valid heard for them from its model
    # (a first call each there; here later calls, after other examples), else twice here. Run
    # beside the suite's process (mizuoto_contract.beside), what it heard comes as digests.
    heard = subject.shared.get(f"explored:{subject.capability}")

    def repeats(example: Example) -> None:
        earlier: bytes | str | None = (heard or {}).get(example)
        elsewhere = earlier is not None
        if not elsewhere:
            earlier = subject.engine_audio(handle, example.text, example.seed, True, named=False)
        again = subject.engine_audio(handle, example.text, example.seed, True, named=False)
        if earlier is None or again is None or same_take(again, earlier):
            return
        if elsewhere:  # another model's take: is this model's own repeatable?
            earlier = again
            again = subject.engine_audio(handle, example.text, example.seed, named=False) or b""
            if again == earlier:
                return  # a fresh load's difference: determinism.fresh_loads's to report
        assert isinstance(earlier, bytes)  # this model's own take (a digest was replaced above)
        raise Fail("the same audio from repeated calls with one seed", differ(earlier, again))

    explore(repeats, subject.cases())
    text = subject.sentence
    first, second = subject.audio(handle, SEED, text), subject.audio(handle, SEED, text)
    if first != second:
        raise Fail(
            "the same audio from one loaded model called twice with one seed",
            differ(first, second),
        )


def fresh_process(subject: Subject) -> None:
    if not subject.first_pass:
        return  # the fresh process speaks the first capability (once per engine)
    audio = subject.audio(subject.load(), SEED, subject.sentence)
    with _globals_reseeded():
        again = subject.audio(subject.load(), SEED, subject.sentence)
    if again != audio:
        # A new process differs in both ways (its own load, its own global RNG states), so this
        # check would only repeat what the in-process checks report.
        raise Skip(
            "not run: a second load in this process, with the global RNGs reseeded, already "
            "differs (see determinism.fresh_loads and determinism.global_rng_independent)"
        )
    here = digest(audio)
    seen = isolated.report(subject)
    there = seen.get("digest")
    if there is None:
        error = seen.get("error") or {"phase": "call", "message": "no audio"}
        raise Fail(
            "the engine to run in a fresh process",
            f"its {error['phase']} failed: {error['message']}",
            error.get("where"),
        )
    if there != here:
        raise Fail(
            "the same audio bytes in a fresh process (with a hash seed of its own)",
            f"sha256 {here} here, {there} there",
        )


def global_rng_independent(subject: Subject) -> None:
    handle = subject.load()
    texts = _texts(subject, 1)
    first = _takes(subject, handle, texts, SEED)
    if _takes(subject, handle, texts, SEED) != first:
        raise Skip("not run: repeated calls already differ (see determinism.same_handle)")
    with _globals_reseeded():
        second = _takes(subject, handle, texts, SEED)
    for text, one, other in zip(texts, first, second, strict=True):
        if one != other:
            raise Fail(
                "output independent of the global torch/numpy/random generators",
                f"reseeding them changed the audio ({differ(one, other)}, for {text!r})",
            )


def seed_matters(subject: Subject) -> None:
    if not subject.first_pass:
        return  # stochastic is the engine's: another capability may rightly ignore the seed
    handle = subject.load()
    text = subject.sentence
    if subject.audio(handle, 1, text) == subject.audio(handle, 2, text):
        raise Fail(
            "different audio for seeds 1 and 2 (the manifest says stochastic=True)",
            "identical audio",
        )


CHECKS = (
    Check(
        "determinism.fresh_loads",
        "One seed gives bitwise-identical audio on two fresh loads.",
        "Users reproduce a take by its seed; a server reloads models at any time.",
        "Draw only from ctx.generator_for(device)/ctx.rng; initialise nothing randomly at load.",
        "core",
        fresh_loads,
        ("streaming", "deterministic"),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "determinism.same_handle",
        "One seed gives the same audio on repeated calls, for every explored seed and text.",
        "State carried from one call to the next (caches, counters) changes later takes.",
        "Reset per-call state at the start of each call; keep caches keyed by their inputs.",
        "core",
        same_handle,
        ("streaming", "deterministic"),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "determinism.fresh_process",
        "One seed gives the same audio bytes in a new process.",
        "Workers and replicas run in other processes and must agree with each other.",
        "Avoid hash()-, id()- or time-dependent choices; seed everything from the request.",
        "core",
        fresh_process,
        ("streaming", "deterministic"),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "determinism.global_rng_independent",
        "Reseeding or drawing from the global RNGs between calls changes nothing.",
        "Other engines and the host use the global generators; an engine reading them cannot "
        "be reproduced.",
        "Pass generator=ctx.generator_for(device) to every torch random call; use ctx.rng.",
        "core",
        global_rng_independent,
        ("streaming", "deterministic"),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "determinism.applied_seed",
        "An unseeded call's reported seed (request.applied['seed']) replays the same take.",
        "A user who liked a take asked for without a seed gets it again only from the seed the "
        "call reports; an engine that draws its own seed when none is given loses it.",
        "Draw only from ctx.generator_for(device)/ctx.rng, which the host seeds (and reports) "
        "when the request has no seed; never pick a seed of the engine's own.",
        "core",
        applied_seed,
        ("streaming", "stochastic", "deterministic"),
        requires=(*STREAM_OUTPUT, "determinism.same_handle"),
    ),
    Check(
        "determinism.seed_matters",
        "A stochastic engine gives different audio for other seeds.",
        "An engine that ignores the seed cannot offer variations, and says stochastic wrongly.",
        "Sample from ctx.generator_for(device); or declare stochastic=False.",
        "core",
        seed_matters,
        ("streaming", "stochastic"),
        requires=STREAM_OUTPUT,
    ),
    Check(
        "determinism.concurrent",
        "Two calls at once on one loaded model give the audio they give one after the other.",
        "A server answers requests from many threads on one model; state shared between calls "
        "(a generator, a cache, a buffer reused in place) mixes them up. Run fully resident and, "
        "for an engine with handles, under a memory budget that streams its layers.",
        "Keep per-call state in locals or the RequestContext; never write to shared modules "
        "or buffers during a call; guard caches with a lock. A library that cannot be made "
        "thread-safe: declare max_concurrency=1 in the manifest, and the host queues the calls.",
        "core",
        concurrent,
        ("streaming",),
        requires=(
            *STREAM_OUTPUT,
            "determinism.same_handle",
            "determinism.global_rng_independent",
        ),
    ),
)
