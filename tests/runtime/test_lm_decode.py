"""The decode loop step by step: what generate collects, lazily, cut to a vocabulary, on a ctx."""

from __future__ import annotations

import pytest
import torch

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import QwenConfig, QwenDecoder, decode, generate
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
SAMPLED = SamplingParams(do_sample=True, top_k=20, temperature=0.9)


def decoder() -> QwenDecoder:
    model = QwenDecoder(QwenConfig.from_dict(CONFIG))
    return init_random(model, torch.Generator().manual_seed(0)).eval()


def prompt(rows: int = 2) -> torch.Tensor:
    return torch.randint(0, 64, (rows, 6), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_the_steps_are_what_generate_returns(kind: str):
    model, ids = decoder(), prompt()
    settings = {"compute.kv_cache": kind}
    with RequestContext(seed=3, settings=settings).bind():
        expected = generate(model, ids, SAMPLED, max_new_tokens=9, output_logits=True)
    with RequestContext(seed=3, settings=settings).bind():
        steps = list(decode(model, ids, SAMPLED, max_new_tokens=9))
    assert torch.equal(torch.stack([s.tokens for s in steps], dim=1), expected.new_tokens)
    assert torch.equal(torch.stack([s.logits for s in steps]), expected.logits)


def test_nothing_runs_before_the_first_step_and_a_closed_loop_stops():
    model, ids = decoder(), prompt()
    cache = model.new_cache("dynamic", batch=2, max_length=20)
    steps = decode(model, ids, max_new_tokens=10, cache=cache)
    assert cache.length == 0
    next(steps), next(steps), next(steps)
    steps.close()
    assert cache.length == ids.shape[1] + 2  # the prompt, then a forward per token fed back


def test_rows_that_end_get_the_pad_id_and_the_loop_stops_when_all_have():
    model, ids = decoder(), prompt()
    greedy = torch.stack([s.tokens for s in decode(model, ids, max_new_tokens=8)], dim=1)
    ends = [int(greedy[0, 1]), int(greedy[1, 2])]  # row 0 ends by its 2nd token, row 1 by its 3rd
    params = SamplingParams(eos_token_id=ends)
    steps = [s.tokens for s in decode(model, ids, params, max_new_tokens=8, pad_token_id=63)]
    tokens = torch.stack(steps, dim=1)
    assert len(steps) <= 3  # every row has ended
    for row in range(2):
        end = next(i for i, t in enumerate(greedy[row].tolist()) if t in ends)
        assert tokens[row, : end + 1].tolist() == greedy[row, : end + 1].tolist()
        assert all(t == 63 for t in tokens[row, end + 1 :].tolist())


def test_only_ids_below_vocab_are_candidates():
    model, ids = decoder(), prompt()
    steps = list(decode(model, ids, SAMPLED, max_new_tokens=12, vocab=10, generator=_gen()))
    assert all(bool((s.tokens < 10).all()) for s in steps)
    assert all(s.logits.shape == (2, 10) for s in steps)
    greedy = list(decode(model, ids, max_new_tokens=4, vocab=10))
    assert all(torch.equal(s.tokens, s.logits.argmax(-1)) for s in greedy)


def _gen() -> torch.Generator:
    return torch.Generator().manual_seed(4)


def test_a_context_passed_is_the_bound_one():
    model, ids = decoder(), prompt()
    with RequestContext(seed=8).bind():
        bound = [s.tokens for s in decode(model, ids, SAMPLED, max_new_tokens=6)]
    ctx = RequestContext(seed=8, settings={"compute.kv_cache": "static"})
    passed = [s.tokens for s in decode(model, ids, SAMPLED, max_new_tokens=6, ctx=ctx)]
    assert all(torch.equal(a, b) for a, b in zip(bound, passed, strict=True))
    assert ctx.applied["kv_cache"] == "static"


def test_sampling_without_a_generator_or_a_context_is_an_error():
    with pytest.raises(ValueError, match="generator"):
        next(decode(decoder(), prompt(), SAMPLED, max_new_tokens=2))


def test_the_old_forward_arguments_warn_and_change_nothing():
    model, ids = decoder(), prompt()
    with torch.inference_mode():
        expected = model(ids, model.new_cache())
        with pytest.warns(DeprecationWarning, match="weights"):
            weights = model.weights()
        with pytest.warns(DeprecationWarning, match="rotary_table"):
            table = model.rotary_table(6)
        with pytest.warns(DeprecationWarning, match="forward"):
            old = model(ids, model.new_cache(), weights=weights, rotary=table)
    assert torch.equal(old, expected)
    with pytest.raises(TypeError, match="wieghts"):
        model(ids, wieghts=weights)
