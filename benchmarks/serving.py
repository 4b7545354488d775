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
4. Tensor parallelism. Greedy decode on benchmarks/decode.py's mid checkpoint (~146M parameters,
   float32, CPU) from its 16-token prompt: TP=2 (two spawned ranks over gloo, ``attention`` and
   ``dense`` tp_size=2, one torch thread each) against TP=1 (one spawned process, with as many
   threads as the two ranks have together, and with one). Decode tokens/s is (N - 1) /
   (t(N) - t(1)), best of the repeats, so the prefill cancels out; the all-reduce time per token
   is the time rank 0 spends inside its groups' ``all_reduce`` (wrapped with a timer here) over
   the same difference. TP tokens are asserted equal to TP=1 tokens.

    python benchmarks/serving.py [--repeats 21] [--clients 4] [--requests 6] [--quick]
                                 [--tp | --no-tp] [--tp-tokens 32] [--tp-repeats 3]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

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


def _tp_rank(rank: int, world: int, threads: int, init_method: str, root: str, run: dict) -> None:
    """One rank of a TP run (or the whole TP=1 run): decode, time; rank 0 writes the record."""
    import torch

    from mizuoto_runtime.context import RequestContext
    from mizuoto_runtime.lm import QwenDecoder, generate
    from mizuoto_runtime.parallel import Groups
    from mizuoto_sdk.parallel import AttentionParallelConfig, DenseParallelConfig, ParallelConfig

    torch.set_num_threads(threads)  # this spawned process's own pool; the ranks share the cores
    groups, reduce, inside = None, None, [0.0, 0]  # seconds inside all_reduce, calls
    if world > 1:
        split = ParallelConfig(
            dense=DenseParallelConfig(tp_size=world),
            attention=AttentionParallelConfig(tp_size=world),
        )
        groups = Groups.start(split.layout(), rank, init_method=init_method, timeout=120.0)
        reduce = groups.all_reduce

        def timed_reduce(tensor: torch.Tensor, group: str = "world") -> torch.Tensor:
            start = time.perf_counter()
            out = reduce(tensor, group)
            inside[0] += time.perf_counter() - start
            inside[1] += 1
            return out

        groups.all_reduce = timed_reduce  # an attribute of this object: the layers call it
    try:
        decoder = QwenDecoder.from_pretrained(Path(root, "mid"), parallel=groups)
        ids = torch.tensor([run["prompt"]])

        def decode(new: int) -> tuple[float, float, int, list[int]]:
            """Seconds, seconds inside all_reduce, its calls, and the new tokens of one generate."""
            if groups is not None:
                groups.barrier()  # both ranks start the timed call together
            before, count = inside
            start = time.perf_counter()
            with RequestContext().bind():
                out = generate(decoder, ids, max_new_tokens=new)
            seconds = time.perf_counter() - start
            return seconds, inside[0] - before, inside[1] - count, out.new_tokens[0].tolist()

        decode(run["tokens"])  # warm-up
        full = one = (float("inf"), 0.0, 0, [])
        for _ in range(run["repeats"]):
            full, one = min(full, decode(run["tokens"])), min(one, decode(1))
        hidden = torch.zeros(1, 1, decoder.config.hidden_size)
        with torch.inference_mode():
            costs = {"lm_head": median_seconds(lambda: decoder.lm_head(hidden))}
            if reduce is not None and groups is not None:
                groups.barrier()
                costs["bare"] = median_seconds(lambda: reduce(hidden.clone(), "dense_tp"))
    finally:
        if groups is not None:
            groups.close()
    if rank == 0:
        params = sum(p.numel() for p in {id(p): p for p in decoder.parameters()}.values())
        record = {"full": full, "one": one, "costs": costs, "params": params * world}
        Path(root, f"tp{world}x{threads}.json").write_text(json.dumps(record))


def median_seconds(step: Callable[[], object], times: int = 200) -> float:
    seconds = []
    for _ in range(times):
        start = time.perf_counter()
        step()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def tensor_parallel(tokens: int, repeats: int) -> None:
    """TP=2 against TP=1 greedy decode on decode.py's mid checkpoint; prints the table."""
    import torch
    import torch.multiprocessing as mp
    from decode import CONFIGS, checkpoint  # benchmarks/ is on sys.path when this runs as a script

    cores = os.cpu_count() or 1
    vocab, seeded = CONFIGS["mid"]["vocab_size"], torch.Generator().manual_seed(1)
    prompt = torch.randint(1, vocab, (16,), generator=seeded).tolist()  # decode.py's prompt
    run = {"prompt": prompt, "tokens": tokens, "repeats": repeats}
    setups = [(1, 2 if cores >= 2 else 1), (1, 1), (2, 1)]  # (ranks, torch threads each)
    with tempfile.TemporaryDirectory() as root:
        checkpoint("mid", Path(root, "mid"))
        records = {}
        for world, threads in setups:
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                init_method = f"tcp://127.0.0.1:{sock.getsockname()[1]}"
            mp.spawn(_tp_rank, args=(world, threads, init_method, root, run), nprocs=world)
            written = Path(root, f"tp{world}x{threads}.json")
            records[world, threads] = json.loads(written.read_text())
    reference = records[setups[0]]["full"][3]
    print(
        f"\ntensor-parallel greedy decode, mid model ({records[setups[0]]['params'] / 1e6:.1f}M "
        f"params, float32, CPU, gloo), 16-token prompt, {tokens} new tokens, best of {repeats}:"
    )
    print(
        f"{'TP':>2} {'threads each':>12} {'tokens/s':>9} {'ms/token':>9} "
        f"{'all-reduce/token':>16} {'calls/token':>11} {'tokens':>9}"
    )
    rates = {}
    for (world, threads), record in records.items():
        full, one = record["full"], record["one"]
        decoded = tokens - 1
        rates[world, threads] = decoded / max(full[0] - one[0], 1e-9)
        reduce = (full[1] - one[1]) / decoded
        calls = (full[2] - one[2]) / decoded
        assert full[3] == reference, f"TP={world} tokens differ from TP=1 tokens"
        same = "reference" if (world, threads) == setups[0] else "equal"
        print(
            f"{world:2} {threads:12} {rates[world, threads]:8.1f}/s "
            f"{1e3 / rates[world, threads]:7.2f}ms "
            + (f"{reduce * 1e3:14.2f}ms {calls:11.0f}" if world > 1 else f"{'-':>16} {'-':>11}")
            + f" {same:>9}"
        )
    tp2 = records[2, 1]
    print(
        f"TP=2 / TP=1 ({setups[0][1]} threads): {rates[2, 1] / rates[setups[0]]:.2f}x; "
        f"TP=2 / TP=1 (1 thread): {rates[2, 1] / rates[1, 1]:.2f}x"
    )
    share = (tp2["full"][1] - tp2["one"][1]) / (tp2["full"][0] - tp2["one"][0])
    calls = (tp2["full"][2] - tp2["one"][2]) / (tokens - 1)
    print(
        f"TP=2 rank 0: {share:.0%} of each decode step inside all_reduce; a bare all-reduce of\n"
        f"one token's hidden state: {tp2['costs']['bare'] * 1e6:.0f} us (median), x {calls:.0f} = "
        f"{tp2['costs']['bare'] * calls * 1e3:.2f} ms; the lm_head (whole on every rank): "
        f"{tp2['costs']['lm_head'] * 1e3:.2f} ms per token"
    )


def met(ok: bool) -> str:
    return "met" if ok else "missed"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=21, help="timed requests per path")
    parser.add_argument("--clients", type=int, default=4, help="concurrent client threads")
    parser.add_argument("--requests", type=int, default=6, help="requests per client")
    parser.add_argument("--tp-tokens", type=int, default=32, help="new tokens per TP decode")
    parser.add_argument("--tp-repeats", type=int, default=3, help="timed decodes per TP setup")
    only = parser.add_mutually_exclusive_group()
    only.add_argument("--tp", action="store_true", help="only the tensor-parallel section")
    only.add_argument("--no-tp", action="store_true", help="skip the tensor-parallel section")
    parser.add_argument("--quick", action="store_true", help="a short run that checks the script")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.clients, args.requests = 3, 2, 1
        args.tp_tokens, args.tp_repeats = 8, 1
    import torch  # only to report the thread count the host (and so each worker) uses

    print(f"torch {torch.__version__}, {os.cpu_count()} cores, {torch.get_num_threads()} threads")
    if not args.tp:
        workers(args)
    if not args.no_tp:
        tensor_parallel(args.tp_tokens, args.tp_repeats)


def workers(args: argparse.Namespace) -> None:
    """Sections 1 to 3: overhead, the pool beside it, and throughput of replicas."""
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
