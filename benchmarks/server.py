"""Streamed synthesis over HTTP against the same engine in this process.

Starts `mizuoto serve` on 127.0.0.1 (a process of its own, a temporary data folder), then times one
request at a time: over HTTP, the client's time to the first body bytes and to the end, beside the
server's own report of the engine's time to its first chunk (`X-Mizuoto-First-Chunk`); in this
process, the host's first chunk and whole request. Medians of `--repeats`, HTTP and in-process
requests alternating, so that the machine's drift falls on both alike; every HTTP answer's PCM is
checked equal to the in-process audio for the same seed.

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


def over_http(client, engine, seed):
    body = {"engine": engine, "text": TEXT, "seed": seed}
    started, first, parts = time.perf_counter(), None, []
    with client.stream("POST", "/api/v1/synthesize", json=body) as answer:
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
                over_http(client, engine, 0)
                local_first, local_total, http_first, http_total, engine_first = [], [], [], [], []
                for seed in range(1, args.repeats + 1):
                    first, total, chunks = in_process(model, seed)
                    local_first.append(first)
                    local_total.append(total)
                    first, total, reported, body = over_http(client, engine, seed)
                    http_first.append(first)
                    http_total.append(total)
                    engine_first.append(reported)
                    if body[44:] != pcm16(np.concatenate(chunks)):
                        raise SystemExit(f"{engine} seed {seed}: the HTTP audio differs")
                print(
                    f"{engine}: first byte over HTTP {median_ms(http_first):.1f} ms, the server's "
                    f"engine to its first chunk {median_ms(engine_first):.1f} ms, in this process "
                    f"{median_ms(local_first):.1f} ms (HTTP / in-process "
                    f"{statistics.median(http_first) / statistics.median(local_first):.2f}x); "
                    f"whole request {median_ms(http_total):.1f} ms over HTTP, "
                    f"{median_ms(local_total):.1f} ms in process "
                    f"({statistics.median(http_total) / statistics.median(local_total):.2f}x)"
                )
            print("every HTTP answer equals the in-process audio for its seed")
    finally:
        server.terminate()
        server.wait(timeout=60)


if __name__ == "__main__":
    main()
