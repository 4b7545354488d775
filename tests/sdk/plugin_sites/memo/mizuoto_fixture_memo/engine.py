"""The ``memo`` engine (see the package docstring); torch is imported on load."""

import numpy as np

from mizuoto_sdk import AudioChunk, Engine, LoadedEngine

LAYERS, WIDTH = 8, 64


class MemoEngine(Engine):
    DEVICES = ("cpu",)

    def load(self, spec, runtime, ctx):
        import torch

        from mizuoto_runtime import ModelHandle, ops

        torch_module = torch.nn.Sequential(
            *(ops.default.Linear(WIDTH, WIDTH) for _ in range(LAYERS))
        )
        generator = torch.Generator().manual_seed(sum(map(ord, spec.model_id)))
        ops.init_random(torch_module, generator)
        if spec.options.get("not_a_handle"):
            return Loaded(torch_module, ("weights",))
        if spec.options.get("plain_module"):
            return Loaded(torch_module, (torch_module,))
        handle = ModelHandle(
            torch_module,
            name=f"memo/{spec.model_id}:stack",
            load_device=spec.device,
            units=list(torch_module),
        )
        return Loaded(torch_module, (handle,))


class Loaded(LoadedEngine):
    def __init__(self, module, handles):
        self.module = module
        self.handles = handles

    def synthesize(self, text, params, ctx):
        import torch

        if params.get("mode") == "oom":
            raise torch.OutOfMemoryError("simulated allocation failure")
        x = torch.linspace(-1, 1, WIDTH)[None]
        for _ in range(int(params.get("chunks", 1))):
            with ctx.use(*self.handles, phase="synthesize"):
                y = self.module(x)
            yield AudioChunk(torch.tanh(y[0]).numpy().astype(np.float32), 16000)
