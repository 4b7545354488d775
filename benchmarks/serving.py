"""Serving a model from worker processes: overhead against inline, throughput of two replicas
against one, and the per-request cost of a ProcessPoolExecutor doing the same job.

All three measurements run in one process, against peers measured in the same run:

1. Overhead. One request at a time, through a local deployment of one replica
   (``engines.<id>.deployment = "local"``, its worker started before timing) and through the
   same model inline, for the bundled sine and codeclm engines. First-chunk latency is from the
   call to the first chunk in the caller's hand; total is until the stream ends. Inline, local,
   local collect and the pool are measured in turn within every repetition, so drift in the
   machine's load hits them all; each figure is the median. The worker uses the host's thread
   count (the default), so its audio is asserted equal to inline audio bit for bit. Goals for
   codeclm: first chunk within +5 ms of inline, total within 1.05x.
2. Throughput. ``--clients`` threads each send ``--requests`` codeclm requests (fixed seeds,
   consumed as streams) to one replica with ``engines.codeclm.threads`` = cores and to two
   replicas with cores / 2 each (at least 1), so both runs use the same cores; requests per
   second of each, and the ratio.
3. The baseline a user would pick instead: a ``concurrent.futures.ProcessPoolExecutor`` of one
   spawned process whose initializer loads the model once through a host of its own; the task
   synthesizes and returns the whole audio as a numpy array. Its total per request, minus
   inline's, is its overhead, set beside ours: the local stream, and the local replica's
   ``collect`` (the whole audio in one frame, the pool's like for like). The pool has no stream,
   so its first chunk is its total.

    python benchmarks/serving.py [--repeats 21] [--clients 4] [--requests 6] [--quick]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from mizuoto_sdk.host import EngineRequest, RuntimeService

ENGINES: dict[str, tuple[str, dict[str, object]]] = {
    # engine id -> (text, params): sine gives one chunk per word; codeclm 37 bytes -> at most
    # 164 code frames, 11 chunks of 16 frames, 2.2 s of audio
    "sine": ("one request through a replica", {"seed": 3}),
    "codeclm": ("Hello from Mizuoto, a short sentence.", {"seed": 3}),
}
QUICK_PARAMS = {"codeclm": {"max_frames": 48}}
THROUGHPUT_TEXT = "Hello from Mizuoto."
WARMUP = 2

_pool_model = None  # the pool worker's model, loaded once per process by its initializer


def _pool_load(engine_id: str) -> None:
    global _pool_model
    _pool_model = RuntimeService().load(engine_id)


def _pool_synthesize(text: str, params: Mapping[str, object]) -> tuple[np.ndarray, int]:
    assert _pool_model is not None, "the pool's initializer loads the model"
    chunks = list(_pool_model.synthesize(text, EngineRequest(params=dict(params))))
    return np.concatenate([c.samples for c in chunks]), chunks[0].sample_rate


def timed_stream(chunks: Iterator) -> tuple[float, float, np.ndarray]:
    """(seconds to the first chunk, seconds to the end, the audio) of a stream started now."""
    start = time.perf_counter()
    first, parts = None, []
    for chunk in chunks:
        if first is None:
            first = time.perf_counter() - start
        parts.append(chunk.samples)
    total = time.perf_counter() - start
    return first if first is not None else total, total, np.concatenate(parts)


def overhead(engine_id: str, repeats: int, quick: bool) -> dict[str, dict[str, float]]:
    """Median first-chunk and total seconds of inline, local and pool for ``engine_id``."""
    text, base = ENGINES[engine_id]
    params = {**base, **(QUICK_PARAMS.get(engine_id, {}) if quick else {})}
    local_settings = {f"engines.{engine_id}.deployment": "local"}
    context = multiprocessing.get_context("spawn")
    with (
        RuntimeService() as inline_service,
        RuntimeService(local_settings) as local_service,
        ProcessPoolExecutor(1, context, _pool_load, (engine_id,)) as pool,
    ):
        inline = inline_service.load(engine_id)
        local = local_service.load(engine_id)
        began = time.perf_counter()
        local.start()
        started = time.perf_counter() - began
        pool.submit(int).result()  # the pool's process is up and its model loaded

        def run_pool() -> tuple[float, float, np.ndarray]:
            start = time.perf_counter()
            audio, _ = pool.submit(_pool_synthesize, text, params).result()
            total = time.perf_counter() - start
            return total, total, audio

        def run_collect() -> tuple[float, float, np.ndarray]:
            start = time.perf_counter()
            chunk = local.collect("synthesize", text, request=EngineRequest(params=params))
            total = time.perf_counter() - start
            return total, total, np.asarray(chunk.samples)

        runs: dict[str, Callable[[], tuple[float, float, np.ndarray]]] = {
            "inline": lambda: timed_stream(inline.synthesize(text, EngineRequest(params=params))),
            "local": lambda: timed_stream(local.synthesize(text, EngineRequest(params=params))),
            "collect": run_collect,
            "pool": run_pool,
        }
        expected = runs["inline"]()[2]
        for name, run in runs.items():
            for _ in range(WARMUP):
                audio = run()[2]
            assert np.array_equal(audio, expected), f"{name} audio differs from inline"
        firsts: dict[str, list[float]] = {name: [] for name in runs}
        totals: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(repeats):
            for name, run in runs.items():
                first, total, _ = run()
                firsts[name].append(first)
                totals[name].append(total)
        print(
            f"{engine_id}: {len(expected)} samples per request; local replica started in "
            f"{started:.2f} s (pid {local.replicas[0].pids[0]}); audio equal to inline: "
            "local yes, local collect yes, pool yes"
        )
    return {
        name: {"first": statistics.median(firsts[name]), "total": statistics.median(totals[name])}
        for name in runs
    }


def throughput(replicas: int, clients: int, requests: int, quick: bool) -> tuple[float, int]:
    """Requests per second of ``clients`` threads on codeclm served by ``replicas`` replicas."""
    cores = os.cpu_count() or 1
    threads = max(1, cores // replicas)
    settings = {
        "engines.codeclm.deployment": "local",
        "engines.codeclm.replicas": replicas,
        "engines.codeclm.threads": threads,
    }
    extra = QUICK_PARAMS["codeclm"] if quick else {}
    with RuntimeService(settings) as service:
        model = service.load("codeclm")
        model.start()
        for seed in range(WARMUP):
            list(model.synthesize(THROUGHPUT_TEXT, EngineRequest(params={"seed": seed, **extra})))
        barrier = threading.Barrier(clients + 1)
        errors: list[BaseException] = []

        def client(index: int) -> None:
            barrier.wait()
            try:
                for number in range(requests):
                    seed = 100 + index * requests + number
                    request = EngineRequest(params={"seed": seed, **extra})
                    list(model.synthesize(THROUGHPUT_TEXT, request))
            except BaseException as error:
                errors.append(error)

        workers = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for worker in workers:
            worker.start()
        barrier.wait()
        start = time.perf_counter()
        for worker in workers:
            worker.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
    return clients * requests / elapsed, threads


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="timed requests per path")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--requests", type=int, default=6, help="requests per client")
    parser.add_argument("--quick", action="store_true", help="a short run that checks the script")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.clients, args.requests = 3, 2, 1
    import torch  # only to report the thread count the host (and so each worker) uses

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} threads")
    results = {engine_id: overhead(engine_id, args.repeats, args.quick) for engine_id in ENGINES}

    print(f"\noverhead of one local replica, median of {args.repeats} requests:")
    print(
        f"{'engine':8} {'inline first':>12} {'local first':>11} {'delta':>8} "
        f"{'inline total':>12} {'local total':>11} {'ratio':>6}"
    )
    for engine_id, times in results.items():
        inline, local = times["inline"], times["local"]
        print(
            f"{engine_id:8} {inline['first'] * 1e3:10.2f}ms {local['first'] * 1e3:9.2f}ms "
            f"{(local['first'] - inline['first']) * 1e3:+6.2f}ms "
            f"{inline['total'] * 1e3:10.2f}ms {local['total'] * 1e3:9.2f}ms "
            f"{local['total'] / inline['total']:5.3f}x"
        )
    codeclm = results["codeclm"]
    first_delta = (codeclm["local"]["first"] - codeclm["inline"]["first"]) * 1e3
    total_ratio = codeclm["local"]["total"] / codeclm["inline"]["total"]
    print(
        f"codeclm goals: first chunk within +5 ms ({first_delta:+.2f} ms: "
        f"{met(first_delta <= 5)}), total within 1.05x ({total_ratio:.3f}x: "
        f"{met(total_ratio <= 1.05)})"
    )

    print("\nper-request overhead against inline (total time), ProcessPoolExecutor against ours:")
    print(
        f"{'engine':8} {'pool total':>10} {'pool over':>10} {'ours stream':>11} "
        f"{'ours collect':>12} {'pool - stream':>13} {'pool - collect':>14}"
    )
    for engine_id, times in results.items():
        over = {name: (times[name]["total"] - times["inline"]["total"]) * 1e3 for name in times}
        print(
            f"{engine_id:8} {times['pool']['total'] * 1e3:8.2f}ms {over['pool']:+8.2f}ms "
            f"{over['local']:+9.2f}ms {over['collect']:+10.2f}ms "
            f"{over['pool'] - over['local']:+11.2f}ms {over['pool'] - over['collect']:+12.2f}ms"
        )

    total = args.clients * args.requests
    print(f"\nthroughput on codeclm, {args.clients} clients x {args.requests} requests ({total}):")
    print(f"{'replicas':8} {'threads each':>12} {'requests/s':>10}")
    rates = {}
    for replicas in (1, 2):
        rates[replicas], threads = throughput(replicas, args.clients, args.requests, args.quick)
        print(f"{replicas:8} {threads:12} {rates[replicas]:10.2f}")
    print(f"2 replicas / 1 replica: {rates[2] / rates[1]:.2f}x")


if __name__ == "__main__":
    main()
