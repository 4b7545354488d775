"""Parity of mizuoto_runtime.sampling with transformers' processors, torch.multinomial and generate.

Every expected value is computed here by the peer itself (transformers 5.24's LogitsProcessor
classes, torch.multinomial after torch.manual_seed, model.generate), and compared bit for bit:
a one-ulp difference in a processed score can flip a sampled token.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import attrs
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from transformers import (
    LogitsProcessorList,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    NoBadWordsLogitsProcessor,
    Qwen2Config,
    Qwen2ForCausalLM,
    RepetitionPenaltyLogitsProcessor,
    SuppressTokensLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from mizuoto_runtime.sampling import (
    InvalidSamplingParams,
    SamplingParams,
    hf_process,
    hf_sample,
    leading_padding,
    multinomial1,
)
from mizuoto_sdk import InvalidRequest

EXAMPLES = settings(max_examples=60, deadline=None)


def assert_same_bits(ours: torch.Tensor, reference: torch.Tensor) -> None:
    """Equal shape, dtype and bits: -inf where the reference has -inf, and nan equal to nan."""
    assert ours.shape == reference.shape and ours.dtype == reference.dtype
    assert torch.equal(ours.view(torch.int32), reference.view(torch.int32)), (ours, reference)


class Step:
    """One decoding step's inputs: fp32 scores [B, V] and the ids seen so far [B, T]."""

    def __init__(self, scores: torch.Tensor, input_ids: torch.Tensor, prompt_length: int) -> None:
        self.scores = scores
        self.input_ids = input_ids
        self.prompt_length = prompt_length

    @property
    def vocab_size(self) -> int:
        return self.scores.shape[-1]


@st.composite
def steps(draw: st.DrawFn, max_vocab: int = 40) -> Step:
    """Random logits with ties, zeros of both signs and -inf entries, and random context ids."""
    batch = draw(st.integers(1, 4))
    vocab = draw(st.integers(2, max_vocab))
    length = draw(st.integers(1, 10))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    scores = torch.randn(batch, vocab, generator=generator) * draw(
        st.sampled_from([0.3, 3.0, 30.0])
    )
    if draw(st.booleans()):
        scores = scores.round()
    blocked = torch.rand(batch, vocab, generator=generator) < draw(st.sampled_from([0.0, 0.1, 0.4]))
    blocked[:, draw(st.integers(0, vocab - 1))] = False  # every row keeps a finite logit
    scores = scores.masked_fill(blocked, -math.inf)
    input_ids = torch.randint(0, vocab, (batch, length), generator=generator)
    return Step(scores, input_ids, draw(st.integers(1, length)))


def token_ids(vocab: int, *, spill: int = 0) -> st.SearchStrategy[list[int]]:
    """Token lists, sometimes with ids past the vocabulary, which upstream's isin ignores."""
    return st.lists(st.integers(0, vocab - 1 + spill), max_size=4)


@st.composite
def bad_words(draw: st.DrawFn, step: Step) -> list[list[int]]:
    """Single and multi-token words; some continue a row's last tokens, so their prefix matches."""
    any_token = st.integers(0, step.vocab_size - 1)
    words = draw(st.lists(st.lists(any_token, min_size=1, max_size=3), max_size=4))
    for _ in range(draw(st.integers(0, 2))):
        row = draw(st.integers(0, step.input_ids.shape[0] - 1))
        prefix = draw(st.integers(1, min(3, step.input_ids.shape[1])))
        words.append([*step.input_ids[row, -prefix:].tolist(), draw(any_token)])
    return words


@st.composite
def padding(draw: st.DrawFn, step: Step) -> torch.Tensor | None:
    """Leading pad positions per row, as generate derives them from a left-padded prompt's mask."""
    if draw(st.booleans()):
        return None
    rows = [draw(st.integers(0, step.prompt_length - 1)) for _ in range(step.input_ids.shape[0])]
    return torch.tensor(rows)


# Exact fractions: with tied logits a cumulative probability lands exactly on 1 - top_p.
TOP_P = st.one_of(st.sampled_from([1.0, 0.0, 0.25, 0.5, 0.75]), st.floats(0.0, 1.0))


@st.composite
def sampling_params(draw: st.DrawFn, step: Step) -> SamplingParams:
    vocab = step.vocab_size
    return SamplingParams(
        do_sample=draw(st.booleans()),
        temperature=draw(st.one_of(st.just(1.0), st.floats(0.3, 2.0))),
        top_k=draw(st.one_of(st.just(0), st.just(50), st.integers(1, 12))),
        top_p=draw(TOP_P),
        min_p=draw(st.one_of(st.none(), st.floats(0.0, 1.0))),
        repetition_penalty=draw(st.one_of(st.just(1.0), st.floats(0.5, 2.0))),
        min_new_tokens=draw(st.integers(0, 4)),
        eos_token_id=draw(st.one_of(st.none(), st.integers(0, vocab - 1), token_ids(vocab))),
        bad_words_ids=draw(bad_words(step)),
        suppress_tokens=draw(token_ids(vocab, spill=3)),
    )


def upstream_processors(
    params: SamplingParams,
    prompt_length: int,
    padding: torch.Tensor | None = None,
    device: str = "cpu",
) -> LogitsProcessorList:
    """The list generate's _get_logits_processor builds for these settings, in its order."""
    eos = torch.tensor(params.eos_token_id, device=device) if params.eos_token_id else None
    processors = LogitsProcessorList()
    if params.repetition_penalty != 1.0:
        processors.append(
            RepetitionPenaltyLogitsProcessor(
                params.repetition_penalty, prompt_ignore_length=padding
            )
        )
    words = [list(word) for word in params.bad_words_ids]
    # Upstream refuses a list whose every word is a lone EOS id; nothing is blocked then.
    if any(len(word) > 1 or word[0] not in params.eos_token_id for word in words):
        processors.append(NoBadWordsLogitsProcessor(words, eos))
    if params.min_new_tokens > 0 and eos is not None:
        processors.append(
            MinNewTokensLengthLogitsProcessor(
                prompt_length, params.min_new_tokens, eos, device=device
            )
        )
    if params.suppress_tokens:
        processors.append(SuppressTokensLogitsProcessor(params.suppress_tokens, device=device))
    if params.do_sample:
        if params.temperature != 1.0:
            processors.append(TemperatureLogitsWarper(params.temperature))
        if params.top_k != 0:
            processors.append(TopKLogitsWarper(params.top_k))
        if params.top_p < 1.0:
            processors.append(TopPLogitsWarper(params.top_p))
        if params.min_p is not None:
            processors.append(MinPLogitsWarper(params.min_p))
    return processors


Processor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def check_one(
    step: Step, params: SamplingParams, processor: Processor, padding: torch.Tensor | None = None
) -> None:
    before = step.scores.clone()
    ours = hf_process(step.scores, step.input_ids, step.prompt_length, params, padding=padding)
    assert_same_bits(step.scores, before)  # the caller's logits are left alone
    assert_same_bits(ours, processor(step.input_ids, step.scores.clone()))


@EXAMPLES
@given(st.data(), steps(), st.floats(0.1, 3.0))
def test_repetition_penalty_matches_upstream(data: st.DataObject, step: Step, penalty: float):
    ignored = data.draw(padding(step))
    params = SamplingParams(repetition_penalty=penalty)
    processor = RepetitionPenaltyLogitsProcessor(penalty, prompt_ignore_length=ignored)
    check_one(step, params, processor, padding=ignored)


@EXAMPLES
@given(st.data(), steps(), st.integers(1, 12))
def test_min_new_tokens_matches_upstream(data: st.DataObject, step: Step, min_new: int):
    eos = data.draw(token_ids(step.vocab_size, spill=2).filter(bool))
    params = SamplingParams(min_new_tokens=min_new, eos_token_id=eos)
    processor = MinNewTokensLengthLogitsProcessor(step.prompt_length, min_new, torch.tensor(eos))
    check_one(step, params, processor)


def test_min_new_tokens_without_eos_is_skipped_like_upstream():
    scores = torch.randn(2, 7)
    params = SamplingParams(min_new_tokens=5)
    assert_same_bits(hf_process(scores, torch.zeros(2, 3, dtype=torch.long), 3, params), scores)


@EXAMPLES
@given(st.data(), steps())
def test_bad_words_match_upstream(data: st.DataObject, step: Step):
    words = data.draw(bad_words(step).filter(bool))
    eos = data.draw(st.one_of(st.none(), st.sampled_from(words[0])))
    params = SamplingParams(bad_words_ids=words, eos_token_id=eos)
    if not upstream_processors(params, step.prompt_length):
        return  # every word was a lone EOS id; test_bad_words_equal_to_eos_are_dropped covers it
    check_one(step, params, NoBadWordsLogitsProcessor(words, eos))


def test_bad_words_equal_to_eos_are_dropped():
    scores = torch.randn(1, 9)
    params = SamplingParams(bad_words_ids=[[4], [1, 4], [5]], eos_token_id=[4, 6])
    processed = hf_process(scores, torch.tensor([[2, 1]]), 2, params)
    assert processed[0, 5] == -math.inf and processed[0, 4] == -math.inf  # [1, 4] matched
    processed = hf_process(scores, torch.tensor([[2, 3]]), 2, params)
    assert processed[0, 4] == scores[0, 4]  # the lone [4] is EOS, so it was dropped


def test_bad_words_that_are_all_eos_block_nothing():
    # Upstream's NoBadWordsLogitsProcessor raises for this list (nothing is left after dropping
    # EOS); blocking nothing is what its dropping rule means.
    scores = torch.randn(2, 9)
    params = SamplingParams(bad_words_ids=[[4], [6]], eos_token_id=[4, 6])
    assert_same_bits(hf_process(scores, torch.tensor([[2], [3]]), 1, params), scores)


def test_bad_words_outside_the_vocabulary_are_an_invalid_request():
    params = SamplingParams(bad_words_ids=[[3], [1, 12]])
    with pytest.raises(InvalidSamplingParams, match="bad_words_ids") as raised:
        hf_process(torch.randn(1, 10), torch.tensor([[1]]), 1, params)
    assert raised.value.detail == {"field": "bad_words_ids"}


@EXAMPLES
@given(st.data(), steps())
def test_suppress_tokens_match_upstream(data: st.DataObject, step: Step):
    suppressed = data.draw(token_ids(step.vocab_size, spill=3).filter(bool))
    params = SamplingParams(suppress_tokens=suppressed)
    check_one(step, params, SuppressTokensLogitsProcessor(suppressed))


@EXAMPLES
@given(steps(), st.floats(0.05, 5.0))
def test_temperature_matches_upstream(step: Step, temperature: float):
    params = SamplingParams(do_sample=True, top_k=0, temperature=temperature)
    check_one(step, params, TemperatureLogitsWarper(temperature))


@EXAMPLES
@given(steps(), st.integers(1, 45))
def test_top_k_matches_upstream(step: Step, top_k: int):
    params = SamplingParams(do_sample=True, top_k=top_k)
    check_one(step, params, TopKLogitsWarper(top_k))


@EXAMPLES
@given(steps(), TOP_P.filter(lambda top_p: top_p < 1.0))
def test_top_p_matches_upstream(step: Step, top_p: float):
    # generate never builds the warper at 1.0, where it would still drop tokens whose
    # probability underflows to 0.
    params = SamplingParams(do_sample=True, top_k=0, top_p=top_p)
    check_one(step, params, TopPLogitsWarper(top_p))


@EXAMPLES
@given(steps(), st.floats(0.0, 1.0))
def test_min_p_matches_upstream(step: Step, min_p: float):
    params = SamplingParams(do_sample=True, top_k=0, min_p=min_p)
    check_one(step, params, MinPLogitsWarper(min_p))


def test_cut_offs_on_exact_boundaries_match_upstream():
    # Equal logits give exact cumulative probabilities (0.25, 0.5, ...) and ties with the top
    # token, where `<=` versus `<` in top-p and min-p decides what survives.
    scores = torch.tensor([[0.0, 0.0, 0.0, 0.0], [2.0, 2.0, -math.inf, 0.0]])
    step = Step(scores, torch.zeros(2, 1, dtype=torch.long), 1)
    for top_p in (0.25, 0.5, 0.75):
        params = SamplingParams(do_sample=True, top_k=0, top_p=top_p)
        check_one(step, params, TopPLogitsWarper(top_p))
    for min_p in (0.5, 1.0):
        params = SamplingParams(do_sample=True, top_k=0, min_p=min_p)
        check_one(step, params, MinPLogitsWarper(min_p))


@settings(max_examples=100, deadline=None)
@given(st.data(), steps(max_vocab=64))
def test_whole_chain_matches_upstream(data: st.DataObject, step: Step):
    params = data.draw(sampling_params(step))
    ignored = data.draw(padding(step))
    reference = upstream_processors(params, step.prompt_length, ignored)
    check_one(step, params, reference, padding=ignored)


@st.composite
def distributions(draw: st.DrawFn) -> tuple[torch.Tensor, int]:
    """Probabilities [B, V] with exact zeros, sometimes unnormalised weights, and a seed."""
    shape = (draw(st.integers(1, 5)), draw(st.integers(1, 300)))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**32 - 1)))
    logits = torch.randn(shape, generator=generator) * draw(st.sampled_from([0.1, 2.0, 10.0]))
    logits[torch.rand(shape, generator=generator) < 0.3] = -math.inf
    logits[:, 0] = 0.0
    probs = logits.softmax(-1)
    if draw(st.booleans()):
        probs = probs * 7.5
    return probs, draw(st.integers(0, 2**63 - 1))


@EXAMPLES
@given(distributions())
def test_multinomial1_matches_torch_multinomial_after_manual_seed(case: tuple[torch.Tensor, int]):
    probs, seed = case
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        expected = torch.multinomial(probs, 1)
        expected_state = torch.get_rng_state()
    global_state = torch.get_rng_state()
    generator = torch.Generator().manual_seed(seed)
    drawn = multinomial1(probs, generator)
    assert drawn.dtype == expected.dtype and torch.equal(drawn, expected)
    assert torch.equal(generator.get_state(), expected_state)
    assert torch.equal(torch.get_rng_state(), global_state)  # the default generator is untouched


@EXAMPLES
@given(distributions(), st.booleans())
def test_multinomial1_matches_torch_multinomial_on_a_generator(
    case: tuple[torch.Tensor, int], replacement: bool
):
    probs, seed = case
    theirs = torch.Generator().manual_seed(seed)
    expected = torch.multinomial(probs, 1, replacement=replacement, generator=theirs)
    ours = torch.Generator().manual_seed(seed)
    assert torch.equal(multinomial1(probs, ours), expected)
    assert torch.equal(ours.get_state(), theirs.get_state())


@EXAMPLES
@given(st.data(), steps(max_vocab=64), st.integers(0, 2**63 - 1))
def test_hf_sample_is_one_upstream_sampling_step(data: st.DataObject, step: Step, seed: int):
    params = data.draw(sampling_params(step))
    reference = upstream_processors(params, step.prompt_length)(step.input_ids, step.scores.clone())
    # torch.multinomial refuses a row that suppress / bad words / min_new_tokens emptied.
    assume(not params.do_sample or bool(torch.isfinite(reference).any(-1).all()))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        if params.do_sample:
            probs = torch.nn.functional.softmax(reference, dim=-1)
            expected = torch.multinomial(probs, num_samples=1).squeeze(1)
        else:
            expected = torch.argmax(reference, dim=-1)
        expected_state = torch.get_rng_state()
    generator = torch.Generator().manual_seed(seed)
    tokens = hf_sample(step.scores, step.input_ids, step.prompt_length, params, generator)
    assert tokens.shape == (step.input_ids.shape[0],) and torch.equal(tokens, expected)
    assert torch.equal(generator.get_state(), expected_state)


@pytest.fixture(scope="module")
def tiny_qwen2() -> Qwen2ForCausalLM:
    """A randomly initialised two-layer Qwen2 whose logits are peaked enough for the filters."""
    config = Qwen2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        initializer_range=0.5,
        tie_word_embeddings=False,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        return Qwen2ForCausalLM(config).eval()


PROMPT = torch.tensor([[17, 30, 44, 51, 10], [0, 0, 23, 61, 10]])
GENERATE_CASES = {
    "defaults": {"do_sample": True},
    "greedy": {"do_sample": False, "repetition_penalty": 1.3},
    "warpers": {
        "do_sample": True,
        "temperature": 0.7,
        "top_k": 20,
        "top_p": 0.8,
        "min_p": 0.05,
        "repetition_penalty": 1.2,
    },
    "constraints": {
        "do_sample": True,
        "top_k": 0,
        "temperature": 1.3,
        "eos_token_id": [43, 7, 12],  # 43 is this model's favourite, so rows finish early
        "min_new_tokens": 3,
        "bad_words_ids": [[5], [43], [10, 11], [61, 10, 2], [40, 41]],
        "suppress_tokens": [8, 9, 95],
        "repetition_penalty": 0.8,
    },
}


@pytest.mark.parametrize("seed", [0, 42])
@pytest.mark.parametrize("case", sorted(GENERATE_CASES))
def test_hf_sample_reproduces_generate(tiny_qwen2: Qwen2ForCausalLM, case: str, seed: int):
    generation = GENERATE_CASES[case]
    params = SamplingParams(**generation)
    mask = (PROMPT != 0).long()  # row 1 is left-padded with pad id 0
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        out = tiny_qwen2.generate(
            PROMPT,
            attention_mask=mask,
            pad_token_id=0,
            max_new_tokens=10,
            disable_compile=True,
            return_dict_in_generate=True,
            output_scores=True,
            output_logits=True,
            **generation,
        )
        state_after_generate = torch.get_rng_state()

    generator = torch.Generator().manual_seed(seed)
    ignored = leading_padding(mask)
    eos = torch.tensor(params.eos_token_id)
    ids = PROMPT
    unfinished = torch.ones(PROMPT.shape[0], dtype=torch.long)
    for logits, scores in zip(out.logits, out.scores, strict=True):
        processed = hf_process(logits, ids, PROMPT.shape[1], params, padding=ignored)
        assert_same_bits(processed, scores)
        tokens = hf_sample(logits, ids, PROMPT.shape[1], params, generator, padding=ignored)
        if params.eos_token_id:  # what _sample does to rows that already finished
            tokens = tokens * unfinished + 0 * (1 - unfinished)
            unfinished = unfinished & ~torch.isin(tokens, eos)
        ids = torch.cat([ids, tokens[:, None]], dim=-1)
    assert torch.equal(ids, out.sequences)
    assert torch.equal(generator.get_state(), state_after_generate)


def test_sampling_leaves_the_default_generator_alone():
    scores = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    params = SamplingParams(do_sample=True, top_p=0.9)
    before = torch.get_rng_state()
    hf_sample(scores, torch.zeros(3, 4, dtype=torch.long), 2, params, torch.Generator())
    assert torch.equal(torch.get_rng_state(), before)


def test_defaults_and_normalised_values():
    # That these defaults are generate's own is checked by the "defaults" generate case.
    params = SamplingParams()
    assert (params.do_sample, params.temperature, params.top_k, params.top_p) == (
        False,
        1.0,
        50,
        1.0,
    )
    assert params.min_p is None and params.repetition_penalty == 1.0
    assert (params.eos_token_id, params.bad_words_ids, params.suppress_tokens) == ((), (), ())
    from_lists = SamplingParams(eos_token_id=7, bad_words_ids=[[1], [2, 3]], suppress_tokens=[4])
    assert from_lists.eos_token_id == (7,)
    assert from_lists.bad_words_ids == ((1,), (2, 3))
    assert from_lists.suppress_tokens == (4,)
    assert from_lists == SamplingParams(
        eos_token_id=[7], bad_words_ids=((1,), (2, 3)), suppress_tokens=(4,)
    )
    assert hash(from_lists) == hash(
        SamplingParams(eos_token_id=(7,), bad_words_ids=[[1], [2, 3]], suppress_tokens=4)
    )
    assert SamplingParams(temperature=2).temperature == 2.0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        params.top_k = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("field", "value", "expected"),
    [
        ("do_sample", 1, "True or False"),
        ("temperature", -0.5, "> 0"),
        ("temperature", math.nan, "> 0"),
        ("temperature", "hot", "> 0"),
        ("top_k", -1, ">= 0"),
        ("top_k", 2.5, ">= 0"),
        ("top_k", True, ">= 0"),
        ("top_p", 1.5, "[0, 1]"),
        ("top_p", math.nan, "[0, 1]"),
        ("min_p", -0.1, "[0, 1]"),
        ("repetition_penalty", 0.0, "> 0"),
        ("repetition_penalty", math.inf, "> 0"),
        ("min_new_tokens", -2, ">= 0"),
        ("eos_token_id", -1, "token id"),
        ("eos_token_id", ["2"], "token id"),
        ("bad_words_ids", [3, 4], "lists of token ids"),
        ("bad_words_ids", [[]], "non-empty"),
        ("bad_words_ids", [[1, -2]], "lists of token ids"),
        ("suppress_tokens", "abc", "token id"),
    ],
)
def test_invalid_params_name_the_field(field: str, value: object, expected: str):
    with pytest.raises(InvalidSamplingParams) as raised:
        SamplingParams(**{field: value})
    error = raised.value
    assert isinstance(error, InvalidRequest) and error.code == "invalid_request"
    assert error.detail == {"field": field}
    assert field in str(error) and expected in str(error)


def test_temperature_zero_is_only_refused_when_sampling():
    assert SamplingParams(temperature=0.0).temperature == 0.0
    with pytest.raises(InvalidSamplingParams, match="do_sample=False") as raised:
        SamplingParams(do_sample=True, temperature=0)
    assert raised.value.detail == {"field": "temperature"}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_sampling_on_cuda_matches_and_never_syncs():
    device = torch.device("cuda")
    scores = torch.randn(4, 1000, device=device)
    input_ids = torch.randint(0, 1000, (4, 12), device=device)
    params = SamplingParams(
        do_sample=True,
        temperature=0.8,
        top_p=0.9,
        min_p=0.02,
        repetition_penalty=1.1,
        min_new_tokens=4,
        eos_token_id=[1, 2],
        bad_words_ids=[[5], [6, 7]],
        suppress_tokens=list(range(100, 200)),
    )
    reference = upstream_processors(params, 8, device="cuda")(input_ids, scores.clone())
    theirs = torch.Generator(device).manual_seed(3)
    expected = torch.multinomial(reference.softmax(-1), 1, generator=theirs).squeeze(1)
    ours = torch.Generator(device).manual_seed(3)
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        processed = hf_process(scores, input_ids, 8, params)
        tokens = hf_sample(scores, input_ids, 8, params, ours)
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    assert_same_bits(processed, reference)
    assert torch.equal(tokens, expected)
    assert torch.equal(ours.get_state(), theirs.get_state())
