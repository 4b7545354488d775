"""A remote engine against the same engine in this process, on loopback.

Starts `mizuoto agent` on 127.0.0.1 (a process of its own, with a token file), then times one
codeclm request at a time through the remote handle (`engines.codeclm.device = box/cpu`) and
through the model loaded in this process: the first chunk's latency and the whole request, median
of `--repeats`, and checks that every remote request's audio equals the local one bit for bit.
Local and remote requests alternate, so that the machine's drift (other load, frequency) falls
on both alike.

    python benchmarks/remote.py [--repeats 21] [--engine codeclm]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

TEXT = "Hello from Mizuoto, a benchmark sentence."


def timed(model, seed):
    from mizuoto_sdk.host import EngineRequest

    request = EngineRequest(params={"seed": seed})
    started, first, chunks = time.perf_counter(), None, []
    for chunk in model.synthesize(TEXT, request):
        first = time.perf_counter() - started if first is None else first
        chunks.append(chunk.samples)
    return first, time.perf_counter() - started, chunks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--engine", default="codeclm")
    args = parser.parse_args()

    from mizuoto_sdk.host import RuntimeService

    folder = tempfile.mkdtemp(prefix="mizuoto-bench-")
    token = os.path.join(folder, "token")
    with open(token, "w") as file:
        file.write(os.urandom(24).hex())
    command = [sys.executable, "-m", "mizuoto_sdk.cli", "agent", "--listen", "127.0.0.1:0"]
    agent = subprocess.Popen([*command, "--token-file", token], stdout=subprocess.PIPE, text=True)
    try:
        assert agent.stdout is not None
        address = agent.stdout.readline().strip().rsplit("://", 1)[1]
        engine = args.engine
        remote_settings = {
            f"engines.{engine}.device": "box/cpu",
            "remote.hosts.box.address": address,
            "remote.hosts.box.token_file": token,
        }
        with RuntimeService() as here, RuntimeService(remote_settings) as there:
            near, far = here.load(engine), there.load(engine)
            started = time.perf_counter()
            far.start()
            connect = time.perf_counter() - started
            timed(near, 10_000), timed(far, 10_000)  # warm both
            local, remote = [], []
            for seed in range(args.repeats):
                local.append(timed(near, seed))
                remote.append(timed(far, seed))
    finally:
        agent.terminate()
        agent.wait(10)
    equal = all(
        len(a[2]) == len(b[2]) and all((x == y).all() for x, y in zip(a[2], b[2], strict=True))
        for a, b in zip(local, remote, strict=True)
    )

    def median(rows, index):
        return 1000 * statistics.median(row[index] for row in rows)

    print(f"{engine}, {args.repeats} requests each, agent on {address} (start: {connect:.2f} s)")
    print(f"{'':12}{'local':>10}{'remote':>10}{'delta':>10}")
    for name, index in (("first chunk", 0), ("total", 1)):
        here, there = median(local, index), median(remote, index)
        print(f"{name:12}{here:9.2f}ms{there:9.2f}ms{there - here:+9.2f}ms  {there / here:.3f}x")
    print(f"remote audio equal to local for every seed: {'yes' if equal else 'NO'}")


if __name__ == "__main__":
    main()
