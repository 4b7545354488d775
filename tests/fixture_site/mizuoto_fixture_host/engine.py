"""The ``hosted`` engine; ``EVENTS`` records what it saw, in order (see the package docstring)."""

import sys
import threading
import time

import numpy as np

from mizuoto_runtime.context import current_context
from mizuoto_sdk import AudioChunk, Engine, InvalidRequest, LoadedEngine

EVENTS = []


def _state(label):
    import torch

    EVENTS.append(
        (
            label,
            torch.is_inference_mode_enabled(),
            current_context() is not None,
            threading.get_ident(),
        )
    )


class HostEngine(Engine):
    DEVICES = ("cpu",)

    def load(self, spec, runtime, ctx):
        _state("load")
        if spec.options.get("fail_load"):
            raise ValueError("load failed on purpose")
        if spec.options.get("exit_load"):
            sys.exit(4)
        return Loaded(spec)


class Loaded(LoadedEngine):
    def __init__(self, spec):
        self.spec = spec

    def describe(self):
        return {"model": self.spec.model_id}

    def unload(self):
        EVENTS.append(("unload", self.spec.model_id))

    def synthesize(self, text, params, ctx):
        _state("start")
        mode = params.get("mode", "tones")
        try:
            for index in range(int(params.get("chunks", 3))):
                if mode == "slow":
                    ctx.check_cancel()
                    time.sleep(0.005)
                    yield AudioChunk(np.zeros(160), 16000)
                    continue
                if mode == "ignore_cancel":
                    time.sleep(0.03)
                if mode == "raise":
                    raise ValueError("broken on purpose")
                if mode == "exit":
                    sys.exit(3)
                if mode == "oom":
                    raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
                if mode == "invalid":
                    raise InvalidRequest("params.mode: bad", {"field": "params.mode"})
                if mode == "echo_params":  # what the engine was handed
                    yield AudioChunk(np.zeros(4, np.float32), 16000, {"params": dict(params)})
                elif mode == "bad_chunk":
                    yield [0.0, 0.1]
                elif mode == "rate_change":
                    yield AudioChunk(np.zeros(10, np.float32), 16000 + index)
                elif mode == "torch":
                    import torch

                    yield AudioChunk(torch.full((2, 8), 0.5, dtype=torch.bfloat16), 8000)
                else:
                    stereo = np.stack(
                        [np.full(4, index, np.float64), np.full(4, index + 1, np.float64)]
                    )
                    yield AudioChunk(stereo, 16000, {"index": index})
                _state(f"chunk{index}")
                ctx.progress(index + 1, 3)
        finally:
            EVENTS.append(("finally", mode))

    def convert(self, audio, params, ctx):
        # The input scaled by ``level``, in two chunks, with a progress report after each.
        samples = np.asarray(audio.samples, np.float32) * float(params.get("level", 0.5))
        half = samples.shape[-1] // 2
        for done, part in enumerate((samples[..., :half], samples[..., half:]), 1):
            yield AudioChunk(part, audio.sample_rate)
            ctx.progress(done, 2)

    def prepare_voice(self, audio, voice_dir, params, ctx):
        (voice_dir / "embedding.npy").write_bytes(b"half")
        if params.get("mode") == "raise":
            raise ValueError("voice failed on purpose")
        return {"files": ["embedding.npy"]}

    def call(self, op, payload, ctx):
        _state("call")
        if op == "echo":
            return dict(payload, seed=ctx.seed)
        if op == "sleep":
            while True:
                ctx.check_cancel()
                time.sleep(0.005)
        return super().call(op, payload, ctx)
