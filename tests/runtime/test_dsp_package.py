"""The dsp package: cheap to import, and its caches right when many threads call at once."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from mizuoto_runtime.dsp import mel_filters, whisper_log_mel

_IMPORTS = """
import json, sys
import mizuoto_runtime
after_root = sorted(m for m in ("torch", "numpy") if m in sys.modules)
import mizuoto_runtime.dsp as dsp
dsp.mel_filters(16000, 400, 80)
after_dsp = sorted(m for m in ("torch", "librosa", "whisper", "scipy") if m in sys.modules)
dsp.whisper_log_mel
after_torch_name = sorted(m for m in ("librosa", "whisper", "scipy") if m in sys.modules)
print(json.dumps([after_root, after_dsp, after_torch_name, "torch" in sys.modules]))
"""


def test_imports_stay_cheap_and_never_reach_the_reference_packages():
    done = subprocess.run(
        [sys.executable, "-c", _IMPORTS], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    after_root, after_dsp, after_torch_name, torch_loaded = json.loads(done.stdout)
    assert "torch" not in after_root
    assert after_dsp == []  # numpy functions loaded and ran: no torch, no librosa/whisper/scipy
    assert after_torch_name == [] and torch_loaded  # torch only for the torch functions


def test_many_threads_with_different_settings_equal_serial_calls():
    rng = np.random.default_rng(0)
    jobs = [
        (
            16_000 + 1_000 * (i % 3),
            int(rng.integers(512, 2048)),
            int(rng.integers(20, 64)),
            bool(i % 2),
            torch.from_numpy(rng.standard_normal(4_000 + 37 * i).astype(np.float32)),
            (80, 128)[i % 2],
        )
        for i in range(16)
    ]

    def work(job):
        rate, n_fft, n_mels, htk, audio, whisper_mels = job
        return mel_filters(rate, n_fft, n_mels, htk=htk), whisper_log_mel(audio, whisper_mels)

    serial = [work(job) for job in jobs]
    for _ in range(3):
        with ThreadPoolExecutor(8) as pool:
            threaded = list(pool.map(work, jobs))
        for (filters, log_mel), (want_filters, want_log_mel) in zip(threaded, serial, strict=True):
            assert np.array_equal(filters, want_filters)
            assert torch.equal(log_mel, want_log_mel)
