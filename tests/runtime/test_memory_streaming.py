"""A QwenDecoder with streamed layers computes bit for bit what the resident decoder computes.

On the CPU the device is simulated (its budget forces streaming; staging slots are CPU tensors
standing for device memory). The ``cuda`` tests stream for real: pinned host copies, a side
stream, events.
"""

from __future__ import annotations

import pytest
import torch
from small_models import HostCopies

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import DynamicCache, QwenConfig, QwenDecoder, generate
from mizuoto_runtime.memory.handle import ModelHandle
from mizuoto_runtime.memory.stream import stage_bytes
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.runtime import Runtime
from mizuoto_runtime.sampling import SamplingParams

VOCAB = 211
SAMPLED = SamplingParams(do_sample=True, top_k=20, temperature=0.9)


def decoder(family: str = "qwen3", layers: int = 5, device: str = "cpu") -> QwenDecoder:
    config = QwenConfig.from_dict(
        {
            "model_type": family,
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 96,
            "num_hidden_layers": layers,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "max_position_embeddings": 256,
        }
    )
    model = init_random(QwenDecoder(config), torch.Generator().manual_seed(0))
    return model.to(device)


def prompt(device: str = "cpu") -> torch.Tensor:
    ids = torch.randint(1, VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    return ids.to(device)


def streaming_runtime(model: QwenDecoder, resident_layers: int) -> tuple[Runtime, ModelHandle]:
    """A simulated device with room for the base, ``resident_layers`` layers and two slots."""
    h = ModelHandle(model, name="tiny:decoder", load_device="cpu", kind="sequence")
    unit = h.unit_parts[0]
    budget = h.base.nbytes + resident_layers * unit.nbytes + 2 * stage_bytes(unit)
    rt = Runtime(simulate={"cpu": budget})
    rt.manager.register([h], owner="tiny@cpu")
    return rt, h


def generated(model: QwenDecoder, params: SamplingParams, ctx: RequestContext, handles=()):
    def phase():
        return generate(model, prompt(), params, max_new_tokens=12, output_logits=True)

    with ctx.bind():
        return ctx.run("generate", phase, handles=handles, working_bytes=0)


@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("resident_layers", [0, 2])
def test_generation_with_streamed_layers_is_bitwise_the_resident_generation(
    family: str, params: SamplingParams, resident_layers: int
):
    model = decoder(family)
    expected = generated(model, params, RequestContext(seed=3))
    rt, h = streaming_runtime(model, resident_layers)
    ctx = RequestContext(seed=3, manager=rt.manager)
    with HostCopies(h.unit_parts) as copies:
        out = generated(model, params, ctx, handles=[h])
    assert h.streamed_bytes == (5 - resident_layers) * h.unit_parts[0].nbytes
    assert copies.count > 0  # streamed layers ran from staged copies
    assert torch.equal(out.tokens, expected.tokens)
    assert torch.equal(out.logits, expected.logits)
    free, total = rt.devices.memory("cpu")
    assert rt.devices.meter("cpu").peak() <= total and free >= 0


def test_a_plain_decode_loop_with_a_dynamic_cache_streams_bitwise():
    model = decoder()
    ids = prompt()

    def decode(cache: DynamicCache) -> list[torch.Tensor]:
        logits, tokens = model(ids, cache), []
        for _ in range(8):
            tokens.append(logits[:, -1].argmax(-1, keepdim=True))
            logits = model(tokens[-1], cache)
        return [*tokens, logits]

    with torch.inference_mode():
        expected = decode(model.new_cache())
    rt, h = streaming_runtime(model, 1)
    with torch.inference_mode(), rt.manager.use(h, phase="decode", working_bytes=0):
        out = decode(model.new_cache())
    assert h.streamed_bytes > 0
    assert all(torch.equal(a, b) for a, b in zip(out, expected, strict=True))


class FlakyContext(RequestContext):
    """Fails to allocate at the third decode step of the first attempt (generate checks for
    cancellation once per step), as a step whose cache outgrew the device would."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.steps = 0

    def check_cancel(self) -> None:
        self.steps += 1
        if self.steps == 3:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB")


def test_an_oom_in_the_middle_of_generation_reruns_exactly():
    model = decoder()
    expected = generated(model, SAMPLED, RequestContext(seed=11))
    h = ModelHandle(model, name="tiny:decoder", load_device="cpu", kind="sequence")
    rt = Runtime(simulate={"cpu": 4 * h.size_bytes})
    rt.manager.register([h], owner="tiny@cpu")
    ctx = FlakyContext(seed=11, manager=rt.manager)
    out = generated(model, SAMPLED, ctx, [h])
    assert ctx.steps > 3  # the failed attempt drew two tokens before failing
    assert torch.equal(out.tokens, expected.tokens) and torch.equal(out.logits, expected.logits)
    assert h.streamed_bytes > 0  # the re-run streamed half the model


def cuda_budget(rt: Runtime, h: ModelHandle, resident_layers: int) -> int:
    """working_bytes that leave room for the base, ``resident_layers`` layers and two slots."""
    free, _ = rt.devices.memory(h.load_device)
    unit = h.unit_parts[0]
    headroom = rt.manager.policy(h.load_device).headroom
    room = h.base.nbytes + resident_layers * unit.nbytes + 2 * stage_bytes(unit) + 512
    return free + h.resident_bytes - headroom - room


@pytest.mark.cuda
@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_cuda_streaming_with_pinned_copies_and_a_side_stream_is_bitwise(params: SamplingParams):
    model = decoder(layers=6, device="cuda")

    def run(ctx: RequestContext, handles=()):
        def phase():
            ids = prompt("cuda")
            return generate(model, ids, params, max_new_tokens=16, output_logits=True)

        with ctx.bind():
            return ctx.run("generate", phase, handles=handles, working_bytes=working)

    working = None
    expected = run(RequestContext(seed=5))
    rt = Runtime()
    h = ModelHandle(model, name="tiny:decoder", load_device="cuda:0", kind="sequence")
    rt.manager.register([h], owner="tiny@cuda:0")
    working = cuda_budget(rt, h, 2)
    out = run(RequestContext(seed=5, manager=rt.manager), [h])
    torch.cuda.synchronize()
    streamed = [p for p in h.unit_parts if p.state == "streamed"]
    assert 3 <= len(streamed) <= 5  # about two of six layers fit beside the slots
    assert all(t.device.type == "cpu" and t.is_pinned() for p in streamed for t in p.tensors)
    assert torch.equal(out.tokens, expected.tokens) and torch.equal(out.logits, expected.logits)
    rt.manager.offload()
    assert h.resident_bytes == 0 and all(t.device.type == "cpu" for t in model.parameters())


@pytest.mark.cuda
def test_cuda_injected_oom_releases_and_reruns_with_more_streaming():
    model = decoder(layers=6, device="cuda")
    expected = generated_on_cuda(model, RequestContext(seed=9))
    rt = Runtime()
    h = ModelHandle(model, name="tiny:decoder", load_device="cuda:0", kind="sequence")
    idle = ModelHandle(decoder(layers=2, device="cuda"), name="idle:decoder", load_device="cuda:0")
    rt.manager.register([idle], owner="idle@cuda:0")
    rt.manager.register([h], owner="tiny@cuda:0")
    attempts = []

    def phase():
        attempts.append(idle.resident_bytes)
        if len(attempts) == 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB. GPU 0")
        return generate(model, prompt("cuda"), SAMPLED, max_new_tokens=16, output_logits=True)

    ctx = RequestContext(seed=9, manager=rt.manager)
    with ctx.bind():
        out = ctx.run("generate", phase, handles=[h])
    assert torch.equal(out.tokens, expected.tokens) and torch.equal(out.logits, expected.logits)
    assert attempts[0] == idle.size_bytes and attempts[1:] == [0]  # released, then one re-run
    assert idle.resident_bytes == 0


def generated_on_cuda(model: QwenDecoder, ctx: RequestContext):
    with ctx.bind():
        return generate(model, prompt("cuda"), SAMPLED, max_new_tokens=16, output_logits=True)


@pytest.mark.cuda
def test_a_handle_on_cuda_without_an_index_names_its_device_as_its_tensors_do():
    model = decoder(layers=2, device="cuda")
    h = ModelHandle(model, name="tiny:decoder", load_device="cuda")
    assert h.load_device == f"cuda:{torch.cuda.current_device()}"
    assert h.resident_bytes == h.size_bytes


def test_cuda_graphs_are_not_captured_over_streamed_layers():
    model = decoder()
    rt, h = streaming_runtime(model, resident_layers=1)
    settings = {"compute.cuda_graphs": True, "compute.kv_cache": "static"}
    ctx = RequestContext(seed=3, settings=settings, manager=rt.manager)
    expected = generated(model, SamplingParams(), RequestContext(seed=3))
    out = generated(model, SamplingParams(), ctx, handles=[h])
    assert "stream from host memory" in ctx.applied["cuda_graphs"]["lm.decode"]
    assert torch.equal(out.tokens, expected.tokens)
