"""CUDA graphs of decode steps: eager off CUDA (and saying so), replay equal to eager on CUDA."""

from __future__ import annotations

import pytest
import torch

from mizuoto_runtime.accel.graphs import Graphs
from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import QwenConfig, QwenDecoder, generate, mask_for
from mizuoto_runtime.lm.rope import Rotary
from mizuoto_runtime.lm.steps import DecoderSteps, LayerSteps, graph_safe
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.sampling import SamplingParams

CONFIG = {
    "model_type": "qwen3",
    "vocab_size": 64,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
}


def decoder(device: str = "cpu", dtype: torch.dtype = torch.float32, **overrides) -> QwenDecoder:
    model = QwenDecoder(QwenConfig.from_dict({**CONFIG, **overrides}), dtype=dtype)
    init_random(model, torch.Generator().manual_seed(0))
    return model.to(device)


def prompt(device: str = "cpu", rows: int = 2) -> torch.Tensor:
    ids = torch.randint(0, 64, (rows, 7), generator=torch.Generator().manual_seed(1))
    return ids.to(device)


SAMPLED = SamplingParams(do_sample=True, top_k=20, top_p=0.9, temperature=0.8)


def run(model: QwenDecoder, ids: torch.Tensor, graphs: bool, params=SAMPLED, **kwargs):
    settings = {"compute.kv_cache": "static", "compute.cuda_graphs": graphs}
    ctx = RequestContext(seed=11, settings=settings)
    with ctx.bind():
        result = generate(model, ids, params, max_new_tokens=12, output_logits=True, **kwargs)
    return result, ctx


def test_off_cuda_the_steps_run_eagerly_and_say_so():
    model, ids = decoder(), prompt()
    eager, _ = run(model, ids, graphs=False)
    result, ctx = run(model, ids, graphs=True)
    assert torch.equal(result.tokens, eager.tokens) and torch.equal(result.logits, eager.logits)
    assert ctx.applied["cuda_graphs"]["lm.decode"].startswith("eager: CUDA graphs need a CUDA")
    assert ctx.warnings == []


def test_graphs_need_a_static_cache():
    model = decoder()
    ctx = RequestContext(settings={"compute.cuda_graphs": True, "compute.kv_cache": "dynamic"})
    with ctx.bind():
        generate(model, prompt(), max_new_tokens=3)
    assert "compute.kv_cache=static" in ctx.applied["cuda_graphs"]["lm.decode"]


def test_graphs_off_cuda_call_the_function():
    calls = []
    graphs = Graphs(lambda x: calls.append(1) or x * 2, name="double", device="cpu")
    assert not graphs.active and "CUDA device" in graphs.reason
    assert torch.equal(graphs(torch.ones(2)), torch.full((2,), 2.0)) and calls == [1]
    assert "is off" in Graphs(lambda x: x, name="off", device="cpu", enabled=False).reason


def test_which_sampling_settings_can_be_captured():
    assert graph_safe(SamplingParams()) and graph_safe(SAMPLED)
    assert graph_safe(SamplingParams(do_sample=True, min_p=0.1, eos_token_id=[3]))
    assert not graph_safe(SamplingParams(repetition_penalty=1.1))
    assert not graph_safe(SamplingParams(bad_words_ids=[[4]]))
    assert not graph_safe(SamplingParams(suppress_tokens=[4]))
    assert not graph_safe(SamplingParams(min_new_tokens=2, eos_token_id=[3]))


def test_dynamic_rope_is_never_captured():
    model = decoder(rope_scaling={"rope_type": "dynamic", "factor": 2.0})
    steps = DecoderSteps(model, model.new_cache("static", batch=2, max_length=16))
    assert not steps.graphs.active and "host" in steps.graphs.reason


def layer_inputs(model: QwenDecoder, ids: torch.Tensor, cache):
    """Hidden state, RoPE and mask of one decode step after a prefill into ``cache``."""
    with torch.inference_mode():
        model(ids, cache)
        tokens = ids[:, -1:]
        positions = torch.full_like(tokens, cache.length)
        x = torch.nn.functional.embedding(tokens, model.model.embed_tokens.weight)
        rotary = Rotary.of(*model.model.rotary_emb(x, positions))
        mask = mask_for(
            ids.shape[0], 1, cache.max_length, cache.position, static=True, device=ids.device
        )
    return x, rotary, mask


def test_layer_steps_off_cuda_equal_the_layers():
    model, ids = decoder(), prompt()
    cache = model.new_cache("static", batch=2, max_length=16)
    x, rotary, mask = layer_inputs(model, ids, cache)
    steps = LayerSteps(model, cache)
    with torch.inference_mode():
        out = steps(x, rotary, mask)
        expected = x
        for layer in model.model.layers:
            expected = layer(expected, rotary, mask, cache)
    assert torch.equal(out, expected)


cuda = pytest.mark.cuda


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("params", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_replay_equals_eager_bitwise(dtype: torch.dtype, params: SamplingParams):
    model, ids = decoder("cuda", dtype), prompt("cuda")
    eager, eager_ctx = run(model, ids, graphs=False, params=params)
    replayed, ctx = run(model, ids, graphs=True, params=params)
    assert ctx.applied["cuda_graphs"]["lm.decode"].startswith("replayed"), ctx.applied
    assert torch.equal(replayed.logits, eager.logits)
    assert torch.equal(replayed.tokens, eager.tokens)
    generator, eager_generator = ctx.generator_for("cuda"), eager_ctx.generator_for("cuda")
    assert torch.equal(generator.get_state(), eager_generator.get_state())


@cuda
def test_replay_with_padding_and_eager_sampling_equals_eager():
    model, ids = decoder("cuda"), prompt("cuda", rows=3)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    params = SamplingParams(do_sample=True, repetition_penalty=1.2)  # sampled outside the graph
    eager, _ = run(model, ids, graphs=False, params=params, padding_mask=mask)
    replayed, ctx = run(model, ids, graphs=True, params=params, padding_mask=mask)
    assert ctx.applied["cuda_graphs"]["lm.decode"].startswith("replayed")
    assert torch.equal(replayed.logits, eager.logits) and torch.equal(replayed.tokens, eager.tokens)


@cuda
def test_layer_steps_replay_equals_eager():
    model, ids = decoder("cuda"), prompt("cuda")
    eager_cache = model.new_cache("static", batch=2, max_length=16)
    graph_cache = model.new_cache("static", batch=2, max_length=16)
    x, rotary, mask = layer_inputs(model, ids, eager_cache)
    layer_inputs(model, ids, graph_cache)
    with torch.inference_mode():
        expected = LayerSteps(model, eager_cache, enabled=False)(x, rotary, mask)
        steps = LayerSteps(model, graph_cache)
        first = steps(x, rotary, mask)  # captures
        again = steps(x, rotary, mask)  # replays
    assert all(layer.active for layer in steps.layers)
    assert torch.equal(first, expected) and torch.equal(again, expected)
    for ours, theirs in zip(graph_cache.keys, eager_cache.keys, strict=True):
        assert torch.equal(ours, theirs)


@cuda
def test_weights_moved_after_capture_are_not_replayed():
    model, ids = decoder("cuda"), prompt("cuda")
    caches = [model.new_cache("static", batch=2, max_length=16) for _ in range(2)]
    steps = DecoderSteps(model, caches[0])
    tokens = ids[:, -1:]
    position = torch.full((2, 1), ids.shape[1], dtype=torch.long, device="cuda")
    with torch.inference_mode():
        for cache in caches:
            model(ids, cache)
        steps(tokens, position)
        model(tokens, caches[1], positions=position)
    assert steps.graphs.active
    for parameter in model.parameters():  # what the memory manager does when it re-places
        parameter.data = parameter.data.clone()
    with torch.inference_mode():
        moved, _ = steps(tokens, position + 1)
        eager = model(tokens, caches[1], positions=position + 1, logits_to_keep=1)
    assert "moved" in steps.graphs.reason
    assert torch.equal(moved, eager[:, -1].float())


def test_a_step_whose_weights_moved_is_never_replayed():
    model, ids = decoder(), prompt()
    steps = DecoderSteps(model, model.new_cache("static", batch=2, max_length=16))
    steps.graphs.reason = None  # as on CUDA: the step would be captured and replayed
    for parameter in model.parameters():  # what the memory manager does when it re-places
        parameter.data = parameter.data.clone()
    position = torch.full((2, 1), 0, dtype=torch.long)
    with torch.inference_mode():
        scores, _ = steps(ids[:, :1], position)
    assert steps.graphs.reason == "the weights moved since the graph was captured; ran eagerly"
    assert scores.shape == (2, 64)
