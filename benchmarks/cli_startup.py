"""Wall time and peak memory of `mizuoto engines` against `python -c "import torch"`.

Listing engines must not import torch; this prints how much that saves, measured in one run:

    python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "mizuoto engines": [sys.executable, "-m", "mizuoto_sdk.cli", "engines"],
    "mizuoto engines --json": [sys.executable, "-m", "mizuoto_sdk.cli", "engines", "--json"],
    "python -c 'import torch'": [sys.executable, "-c", "import torch"],
    "python -c 'pass'": [sys.executable, "-c", "pass"],
}


def measure(command: list[str]) -> tuple[float, float]:
    """Seconds and peak resident MiB of one run of ``command``."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{command} failed")
    return elapsed, usage.ru_maxrss / 1024  # ru_maxrss is KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    repeats = parser.parse_args().repeats
    for command in COMMANDS.values():  # warm the page cache once
        measure(command)
    results = {}
    for name, command in COMMANDS.items():
        runs = [measure(command) for _ in range(repeats)]
        results[name] = (statistics.median(t for t, _ in runs), max(m for _, m in runs))
    torch_time, torch_memory = results["python -c 'import torch'"]
    print(f"{'command':<28}{'median s':>10}{'peak MiB':>10}{'time/torch':>12}{'mem/torch':>11}")
    for name, (seconds, memory) in results.items():
        print(
            f"{name:<28}{seconds:>10.3f}{memory:>10.1f}{seconds / torch_time:>12.2f}"
            f"{memory / torch_memory:>11.2f}"
        )


if __name__ == "__main__":
    main()
