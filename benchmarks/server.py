"""Streamed synthesis over HTTP against the same engine in this process.

Starts `mizuoto serve` on 127.0.0.1 (a process of its own, a temporary data folder), then times one
request at a time: over HTTP, the client's time to the first body bytes and to the end, beside the
server's own report of the engine's time to its first chunk (`X-Mizuoto-First-Chunk`); in this
process, the host's first chunk and whole request. Each HTTP route is timed: the native
`POST /api/v1/synthesize` and the OpenAI route `POST /v1/audio/speech` (`response_format` wav).
Medians of `--repeats`, the routes and the in-process requests alternating, so that the machine's
drift falls on all alike; every HTTP answer's PCM is checked equal to the in-process audio for the
same seed.

    python benchmarks/server.py [--repeats 21] [--engine sine --engine codeclm]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

# benchmarks/ is on sys.path when this runs as a script
from remote import TEXT
from remote import timed as in_process


def native(engine, seed):
    return "/api/v1/synthesize", {"engine": engine, "text": TEXT, "seed": seed}


def openai(engine, seed):
    body = {"model": engine, "input": TEXT, "voice": "default", "response_format": "wav"}
    return "/v1/audio/speech", {**body, "seed": seed}


ROUTES = {"native": native, "openai": openai}


def over_http(client, route, engine, seed):
    path, body = ROUTES[route](engine, seed)
    started, first, parts = time.perf_counter(), None, []
    with client.stream("POST", path, json=body) as answer:
        answer.raise_for_status()
        for part in answer.iter_raw():
            first = time.perf_counter() - started if first is None else first
            parts.append(part)
        engine_first = float(answer.headers["x-mizuoto-first-chunk"])
    return first, time.perf_counter() - started, engine_first, b"".join(parts)


def start_server(home):
    env = dict(os.environ, MIZUOTO_HOME=home)
    command = [sys.executable, "-m", "mizuoto_sdk.cli", "serve", "--port", "0"]
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    server = subprocess.Popen(command, env=env, **quiet)
    record_file = os.path.join(home, "server.json")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if os.path.exists(record_file):
            with open(record_file) as file:
                record = json.load(file)
            if record["pid"] == server.pid:
                return server, record["url"]
        time.sleep(0.05)
    server.kill()
    raise SystemExit("mizuoto serve did not start in 60 s")


def median_ms(values):
    return statistics.median(values) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--engine", action="append", dest="engines")
    args = parser.parse_args()
    engines = args.engines or ["sine", "codeclm"]

    import httpx
    import numpy as np

    from mizuoto_sdk.audio import pcm16
    from mizuoto_sdk.host import RuntimeService

    server, url = start_server(tempfile.mkdtemp(prefix="mizuoto-bench-"))
    try:
        with RuntimeService() as service, httpx.Client(base_url=url, timeout=600) as client:
            print(f"server {url} (pid {server.pid}); median of {args.repeats} requests each")
            for engine in engines:
                model = service.load(engine)
                in_process(model, 0)  # warm both: loads, first-call work
                for route in ROUTES:
                    over_http(client, route, engine, 0)
                local_first, local_total = [], []
                timed = {route: ([], [], []) for route in ROUTES}  # first, total, engine's first
                for seed in range(1, args.repeats + 1):
                    first, total, chunks = in_process(model, seed)
                    local_first.append(first)
                    local_total.append(total)
                    for route, (firsts, totals, engine_firsts) in timed.items():
                        first, total, reported, body = over_http(client, route, engine, seed)
                        firsts.append(first)
                        totals.append(total)
                        engine_firsts.append(reported)
                        if body[44:] != pcm16(np.concatenate(chunks)):
                            raise SystemExit(f"{engine} seed {seed}: the {route} audio differs")
                for route, (http_first, http_total, engine_first) in timed.items():
                    first_ratio = statistics.median(http_first) / statistics.median(local_first)
                    total_ratio = statistics.median(http_total) / statistics.median(local_total)
                    extra = median_ms(http_first) - median_ms(local_first)
                    print(
                        f"{engine} {route}: first byte over HTTP {median_ms(http_first):.1f} ms, "
                        f"the server's engine to its first chunk {median_ms(engine_first):.1f} "
                        f"ms, in this process {median_ms(local_first):.1f} ms ({first_ratio:.2f}x, "
                        f"{extra:+.1f} ms); whole request {median_ms(http_total):.1f} ms over "
                        f"HTTP, {median_ms(local_total):.1f} ms in process ({total_ratio:.2f}x)"
                    )
            print("every HTTP answer equals the in-process audio for its seed")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
