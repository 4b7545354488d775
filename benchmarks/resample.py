"""``mizuoto_runtime.resample`` against ``scipy.signal.resample_poly`` on the same audio.

Voices arrive at any rate; the odd ones (999983 Hz, 191999 Hz) are where an exact polyphase
filter bank needs one phase per output position. Both resample the same seconds of noise to
16 kHz; the printed ratio is ours / scipy's best-of-repeats wall time, measured in one run.
scipy is the peer only here (the runtime does not depend on it):

    pip install scipy && python benchmarks/resample.py [--repeats 3] [--seconds 1]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np

from mizuoto_runtime import resample


def best(function: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    try:
        from scipy.signal import resample_poly
    except ImportError:
        raise SystemExit("this benchmark compares against scipy: pip install scipy") from None
    print(f"{'source Hz':>10} {'ours s':>9} {'scipy s':>9} {'ours/scipy':>11}")
    for source in (48_000, 44_100, 22_050, 191_999, 999_983):
        x = np.random.default_rng(0).standard_normal(int(source * args.seconds))
        x = x.astype(np.float32)
        ours = best(lambda x=x, source=source: resample(x, source, 16_000), args.repeats)
        peer = best(lambda x=x, source=source: resample_poly(x, 16_000, source), args.repeats)
        print(f"{source:>10} {ours:>9.4f} {peer:>9.4f} {ours / peer:>10.2f}x")


if __name__ == "__main__":
    main()
