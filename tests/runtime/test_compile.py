"""compile_module: torch.compile(dynamic=True) when asked, eager with a warning when it fails."""

from __future__ import annotations

import torch
from torch import nn

from mizuoto_runtime.accel.compile import Compiled, compile_module
from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import QwenConfig, QwenDecoder, generate
from mizuoto_runtime.ops import init_random


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(self.proj(x)) * 2 + x


def block() -> Block:
    module = Block()
    init_random(module, torch.Generator().manual_seed(0))
    return module


def broken_backend(calls: list[int]):
    def backend(graph_module, example_inputs):
        calls.append(1)
        raise RuntimeError("forced compiler error")

    return backend


def test_disabled_returns_the_module_itself():
    module = block()
    assert compile_module(module, False, "block") is module


def test_a_compiler_error_falls_back_to_eager_with_one_warning():
    module, calls = block(), []
    compiled = compile_module(module, True, "block", backend=broken_backend(calls))
    assert isinstance(compiled, Compiled)
    x = torch.randn(3, 8, generator=torch.Generator().manual_seed(1))
    ctx = RequestContext()
    with ctx.bind(), torch.no_grad():
        first, second = compiled(x), compiled(x[:2])
        expected = module(x)
    assert torch.equal(first, expected) and torch.equal(second, module(x[:2]))
    assert len(calls) == 1  # no second attempt once it failed
    (warning,) = ctx.warnings
    assert "compute.compile for block failed" in warning and "forced compiler error" in warning
    assert ctx.applied["compile"]["block"].startswith("eager (BackendCompilerFailed")
    assert compiled.fallback is not None and "forced compiler error" in compiled.fallback


def test_a_graph_break_is_a_fallback_too():
    class Chatty(Block):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if x.sum().item() > 1e9:  # data-dependent Python control flow: no full graph
                return x
            return self.proj(x)

    module = Chatty()
    init_random(module, torch.Generator().manual_seed(0))
    compiled = compile_module(module, True, "chatty", backend="eager")
    ctx = RequestContext()
    x = torch.randn(2, 8, generator=torch.Generator().manual_seed(2))
    with ctx.bind(), torch.no_grad():
        assert torch.equal(compiled(x), module(x))
    assert ctx.applied["compile"]["chatty"].startswith("eager (")
    assert len(ctx.warnings) == 1


def test_attributes_reach_the_module():
    module = block()
    compiled = compile_module(module, True, "block", backend="eager")
    assert compiled.proj is module.proj and compiled.calls == 0


def test_a_traced_decoder_generates_eagers_tokens():
    # backend="eager" traces the whole forward (fullgraph, dynamic shapes) without inductor, so
    # this checks the decoder is traceable with both caches at the cost of tracing only.
    config = QwenConfig.from_dict(
        {
            "model_type": "qwen3",
            "vocab_size": 64,
            "hidden_size": 32,
            "intermediate_size": 48,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 8,
        }
    )
    decoder = QwenDecoder(config)
    init_random(decoder, torch.Generator().manual_seed(0))
    ids = torch.randint(0, 64, (1, 6), generator=torch.Generator().manual_seed(3))
    expected = generate(decoder, ids, max_new_tokens=6).tokens
    for kind in ("dynamic", "static"):
        ctx = RequestContext(settings={"compute.kv_cache": kind, "compute.attention": "math"})
        with ctx.bind():
            compiled = compile_module(decoder, True, "lm", backend="eager")
            assert torch.equal(generate(compiled, ids, max_new_tokens=6).tokens, expected)
        assert ctx.applied["compile"] == {"lm": "torch.compile"} and ctx.warnings == []
        # compiled code cannot see the request, so attention ran the reference there
        assert "attention" not in ctx.applied


def test_inductor_compiles_a_module_that_matches_eager():
    module = block()
    compiled = compile_module(module, True, "block")
    ctx = RequestContext()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(4))
    with ctx.bind(), torch.no_grad():
        out = compiled(x)
        again = compiled(torch.randn(7, 8))  # dynamic=True: another batch, no error
    torch.testing.assert_close(out, module(x), rtol=1e-5, atol=1e-5)
    assert again.shape == (7, 8)
    assert ctx.applied["compile"] == {"block": "torch.compile"} and ctx.warnings == []
