"""determinism.concurrent: calls at once on one loaded model, resident and with layers streamed."""

from __future__ import annotations

import contextlib
import threading

from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.subject import SEED, Subject, differ, join
from mizuoto_sdk.host import EngineRequest, LocalModel

_JOIN_SECONDS = 600.0


def _together(subject: Subject, handle: LocalModel, seeds: tuple[int, ...]) -> list[bytes]:
    """One stream per seed, each on its own thread, pulled in lock step so that they overlap.

    An engine that declares ``max_concurrency`` below the number of streams has the host queue
    them, a stream keeping its turn until it ends: lock step would wait for a stream that cannot
    begin, so its streams are only started together, and the host's queue is what is checked.
    """
    limit = subject.manifest.max_concurrency
    barrier = threading.Barrier(len(seeds) if limit is None or limit >= len(seeds) else 1)
    results: list[bytes | None] = [None] * len(seeds)
    errors: list[BaseException | None] = [None] * len(seeds)

    def work(index: int) -> None:
        chunks = []
        try:
            for chunk in subject.stream(handle, EngineRequest(params={"seed": seeds[index]})):
                chunks.append(chunk)
                with contextlib.suppress(threading.BrokenBarrierError):
                    barrier.wait(timeout=_JOIN_SECONDS)
            results[index] = join(chunks)
        except BaseException as error:
            errors[index] = error
        finally:
            barrier.abort()  # the other stream runs on alone

    threads = [
        threading.Thread(target=work, args=(i,), name=f"mizuoto-contract-call-{i}", daemon=True)
        for i in range(len(seeds))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=_JOIN_SECONDS)
    for error in errors:
        if error is not None:
            raise Fail(
                "both calls to succeed when made at once",
                f"{type(error).__name__}: {error}",
                subject.where(error),
            )
    if any(r is None for r in results):
        raise Fail("both calls to end", f"still running after {_JOIN_SECONDS:.0f} s")
    return [r for r in results if r is not None]


def _compare(subject: Subject, handle: LocalModel, how: str) -> None:
    seeds = (SEED, SEED + 1)
    serial = [subject.audio(handle, seed) for seed in seeds]
    together = _together(subject, handle, seeds)
    for seed, alone, mixed in zip(seeds, serial, together, strict=True):
        if alone != mixed:
            raise Fail(
                f"the serial audio of seed {seed} from two calls at once ({how})",
                differ(alone, mixed),
            )
    again = subject.audio(handle, SEED)
    if again != serial[0]:
        raise Fail(
            f"the first audio from a serial call after the concurrent ones ({how})",
            differ(serial[0], again),
        )


def _streaming_budget_mb(handle: LocalModel) -> float | None:
    """A simulated device size that holds half the model (at least two of its largest parts),
    so that the rest streams layer by layer; None when no such size is smaller than the model."""
    if not handle.model_handles or handle.spec.device != "cpu":
        return None
    total = sum(h.size_bytes for h in handle.model_handles)
    largest = max(p.nbytes for h in handle.model_handles for p in h.parts)
    budget = max(total // 2, 2 * largest)
    return budget / 2**20 if budget < total else None


def concurrent(subject: Subject) -> None:
    handle = subject.load()
    _compare(subject, handle, "fully resident")
    budget = _streaming_budget_mb(handle)
    handle.engine.unload()
    if budget is None:
        return
    service = subject.service({"compute.simulate_vram_mb": budget})
    streamed = subject.load(service)
    try:
        _compare(subject, streamed, f"layers streamed under a {budget:.2f} MiB budget")
        rows = service.runtime.manager.residency()
        if not any(row["streamed_bytes"] or row["host_bytes"] for row in rows):
            raise Skip(
                f"not run with streaming: the runtime kept the whole model resident under a "
                f"{budget:.2f} MiB budget"
            )
    finally:
        service.unload()
