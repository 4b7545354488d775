"""One decoding step with transformers' numerics, drawn on the request's own generator.

An engine ported from a transformers model samples here, so that a request seeded ``s`` picks the
same tokens as upstream ``generate(do_sample=True)`` after ``torch.manual_seed(s)``, while never
touching the process-wide generator the host and other engines share. Every processor is written
with upstream's own ops in upstream's order (transformers 5.24 ``_get_logits_processor``), so the
fp32 scores are bit-identical, not merely close: a one-ulp difference can flip a sampled token.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, TypeGuard

import attrs
import torch

from mizuoto_sdk.errors import InvalidRequest

__all__ = [
    "InvalidSamplingParams",
    "SamplingParams",
    "hf_process",
    "hf_sample",
    "leading_padding",
    "multinomial1",
]


class InvalidSamplingParams(InvalidRequest):
    """A sampling setting has the wrong type or range; ``detail["field"]`` names the setting."""


def _invalid(field: str, expected: str, got: object) -> InvalidSamplingParams:
    return InvalidSamplingParams(
        f"sampling parameter {field}: expected {expected}, got {got!r}", {"field": field}
    )


def _is_int(value: object) -> TypeGuard[numbers.Integral]:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_real(value: object) -> TypeGuard[numbers.Real]:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


# Converters only normalise what is well-formed (numpy scalars, lists); anything else is passed on
# unchanged so that the field's validator can reject it with the field's name.


def _to_float(value: object) -> object:
    return float(value) if _is_real(value) else value


def _to_int(value: object) -> object:
    return int(value) if _is_int(value) else value


def _to_token_ids(value: object) -> object:
    if value is None:
        return ()
    if _is_int(value):
        return (int(value),)
    if isinstance(value, (list, tuple)) and all(_is_int(token) for token in value):
        return tuple(int(token) for token in value)
    return value


def _to_token_sequences(value: object) -> object:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)) and all(isinstance(word, (list, tuple)) for word in value):
        words = tuple(_to_token_ids(word) for word in value)
        if all(isinstance(word, tuple) for word in words):
            return words
    return value


def _check_bool(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool):
        raise _invalid(attribute.name, "True or False", value)


def _check_count(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _is_int(value) or value < 0:
        raise _invalid(attribute.name, "an integer >= 0", value)


def _check_positive(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, float) or not math.isfinite(value) or value <= 0:
        raise _invalid(attribute.name, "a finite number > 0", value)


def _check_fraction(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, float) or not 0.0 <= value <= 1.0:
        raise _invalid(attribute.name, "a number in [0, 1]", value)


def _check_temperature(
    params: SamplingParams, attribute: attrs.Attribute[Any], value: object
) -> None:
    # Upstream only builds the temperature warper when sampling, so temperature=0 with greedy
    # decoding is a common, harmless idiom; sampling at 0 would divide by zero.
    if not isinstance(value, float) or not math.isfinite(value) or value < 0:
        raise _invalid(attribute.name, "a finite number > 0 (0 only with do_sample=False)", value)
    if value == 0 and params.do_sample:
        expected = "a number > 0 when do_sample is True (for greedy decoding, do_sample=False)"
        raise _invalid(attribute.name, expected, value)


def _are_token_ids(value: object) -> bool:
    return isinstance(value, tuple) and all(_is_int(token) and int(token) >= 0 for token in value)


def _check_token_ids(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not _are_token_ids(value):
        raise _invalid(attribute.name, "a token id >= 0 or a list of them", value)


def _check_token_sequences(_: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, tuple) or not all(word and _are_token_ids(word) for word in value):
        raise _invalid(attribute.name, "a list of non-empty lists of token ids >= 0", value)


@attrs.frozen(kw_only=True)
class SamplingParams:
    """The decoding settings of one request, checked once before any tensor is touched.

    Defaults are what ``generate`` uses when a setting is unset (greedy; top_k 50, top_p 1.0 and
    temperature 1.0 once sampling), and a setting at its neutral value skips its processor exactly
    as upstream does: temperature 1.0, top_k 0, top_p 1.0, repetition_penalty 1.0, min_p None, and
    min_new_tokens without an EOS id. Token lists are stored as tuples so a value is hashable.
    """

    do_sample: bool = attrs.field(default=False, validator=_check_bool)
    temperature: float = attrs.field(default=1.0, converter=_to_float, validator=_check_temperature)
    top_k: int = attrs.field(default=50, converter=_to_int, validator=_check_count)
    top_p: float = attrs.field(default=1.0, converter=_to_float, validator=_check_fraction)
    min_p: float | None = attrs.field(
        default=None, converter=_to_float, validator=attrs.validators.optional(_check_fraction)
    )
    repetition_penalty: float = attrs.field(
        default=1.0, converter=_to_float, validator=_check_positive
    )
    min_new_tokens: int = attrs.field(default=0, converter=_to_int, validator=_check_count)
    eos_token_id: tuple[int, ...] = attrs.field(
        default=(), converter=_to_token_ids, validator=_check_token_ids
    )
    bad_words_ids: tuple[tuple[int, ...], ...] = attrs.field(
        default=(), converter=_to_token_sequences, validator=_check_token_sequences
    )
    suppress_tokens: tuple[int, ...] = attrs.field(
        default=(), converter=_to_token_ids, validator=_check_token_ids
    )


def leading_padding(attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row, how many leading prompt positions the repetition penalty ignores.

    ``generate`` (5.24) derives this from the prompt's attention mask (the first attended
    position), so left-padding tokens are not penalised; pass it to ``hf_process`` for a padded
    batch.
    """
    return (attention_mask != 0).int().argmax(dim=1)


def _ids(tokens: Sequence[int] | Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    # Upstream builds its id tensors once per generate call; these are built every step, so the
    # copy to the device is non-blocking (pageable memory is staged at once, nothing waits).
    return torch.tensor(tokens, dtype=torch.long).to(device, non_blocking=True)


def _vocab_mask(scores: torch.Tensor, tokens: Sequence[int]) -> torch.Tensor:
    # The same mask as upstream's isin(arange(V), ids), ids outside the vocabulary ignored alike,
    # built as a fill whose cost and behaviour do not depend on how many ids there are.
    vocab_size = scores.shape[-1]
    mask = torch.zeros(vocab_size, dtype=torch.bool, device=scores.device)
    inside = sorted({token for token in tokens if token < vocab_size})
    return mask.index_fill_(0, _ids(inside, scores.device), True) if inside else mask


def _repetition_penalty(
    scores: torch.Tensor, input_ids: torch.Tensor, penalty: float, padding: torch.Tensor | None
) -> torch.Tensor:
    vocab_size = scores.shape[-1]
    if padding is not None:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        ignored = positions[None, :] < padding.to(input_ids.device)[:, None]
        input_ids = input_ids.masked_fill(ignored, vocab_size)
    # Ids past the vocabulary land in one extra column that is dropped afterwards.
    input_ids = input_ids.clamp(max=vocab_size)
    padded = torch.nn.functional.pad(scores, (0, 1))
    seen = torch.gather(padded, 1, input_ids)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return padded.scatter(1, input_ids, seen)[..., :vocab_size]


def _no_bad_words(
    scores: torch.Tensor, input_ids: torch.Tensor, words: Sequence[tuple[int, ...]]
) -> torch.Tensor:
    # Upstream adds a bias of 0 or -inf rather than masking; adding keeps its bits (-0.0 -> +0.0,
    # +inf -> nan) where a masked_fill would not.
    vocab_size = scores.shape[-1]
    too_large = sorted({token for word in words for token in word if token >= vocab_size})
    if too_large:
        raise InvalidSamplingParams(
            f"sampling parameter bad_words_ids: expected token ids below the vocabulary size "
            f"{vocab_size}, got {too_large}",
            {"field": "bad_words_ids"},
        )
    bias = torch.zeros_like(scores)
    single = [word[0] for word in words if len(word) == 1]
    if single:
        static = torch.zeros(vocab_size, dtype=torch.float32, device=scores.device)
        bias += static.index_fill_(0, _ids(single, scores.device), -math.inf)
    by_prefix_length: dict[int, list[tuple[int, ...]]] = {}
    for word in words:
        if len(word) > 1:
            by_prefix_length.setdefault(len(word) - 1, []).append(word)
    for length, group in by_prefix_length.items():
        if length > input_ids.shape[1]:
            continue
        prefixes = _ids([word[:-1] for word in group], scores.device)
        last_tokens = _ids([word[-1] for word in group], scores.device)
        matching = (input_ids[:, None, -length:] == prefixes).all(dim=-1)  # [B, words]
        blocked = torch.where(matching, -math.inf, 0.0).to(bias.dtype)
        bias.index_add_(1, last_tokens, blocked)
    return scores + bias


def _top_k(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    k = min(top_k, scores.size(-1))
    return scores.masked_fill(scores < torch.topk(scores, k)[0][..., -1, None], -math.inf)


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    sorted_logits, sorted_indices = torch.sort(scores, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    sorted_remove = cumulative <= (1 - top_p)
    sorted_remove[..., -1:] = 0  # min_tokens_to_keep is 1 outside beam search
    remove = sorted_remove.scatter(1, sorted_indices, sorted_remove)
    return scores.masked_fill(remove, -math.inf)


def _min_p(scores: torch.Tensor, min_p: float) -> torch.Tensor:
    probs = torch.softmax(scores, dim=-1)
    remove = probs < min_p * probs.amax(dim=-1, keepdim=True)
    remove.scatter_(-1, torch.topk(probs, 1, dim=-1).indices, False)
    return scores.masked_fill(remove, -math.inf)


def hf_process(
    scores: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_length: int,
    params: SamplingParams,
    *,
    padding: torch.Tensor | None = None,
) -> torch.Tensor:
    """``generate``'s logits processors on next-token ``scores`` [B, V], bit for bit.

    ``input_ids`` [B, T] is the prompt plus what was generated so far and ``prompt_length`` the
    prompt's width including padding, as upstream counts new tokens. ``padding`` is
    ``leading_padding(prompt_attention_mask)`` for left-padded batches (None: nothing ignored).
    Scores are processed in fp32 because ``generate`` copies logits to fp32 first; the input is
    never modified.
    """
    scores = scores.to(torch.float32)
    if params.repetition_penalty != 1.0:
        scores = _repetition_penalty(scores, input_ids, params.repetition_penalty, padding)
    # A single-token bad word equal to an EOS id is dropped, so EOS stays reachable.
    eos_words = {(token,) for token in params.eos_token_id}
    bad_words = [word for word in dict.fromkeys(params.bad_words_ids) if word not in eos_words]
    if bad_words:
        scores = _no_bad_words(scores, input_ids, bad_words)
    generated = input_ids.shape[-1] - prompt_length
    if params.min_new_tokens > 0 and params.eos_token_id and generated < params.min_new_tokens:
        scores = torch.where(_vocab_mask(scores, params.eos_token_id), -math.inf, scores)
    if params.suppress_tokens:
        scores = torch.where(_vocab_mask(scores, params.suppress_tokens), -math.inf, scores)
    if params.do_sample:
        if params.temperature != 1.0:
            scores = scores / params.temperature
        if params.top_k != 0:
            scores = _top_k(scores, params.top_k)
        if params.top_p < 1.0:
            scores = _top_p(scores, params.top_p)
        if params.min_p is not None:
            scores = _min_p(scores, params.min_p)
    return scores


def multinomial1(probs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One draw per row of ``probs`` [B, V] -> [B, 1], equal to ``torch.multinomial(probs, 1)``.

    This is torch's own fast path (the exponential race: argmax of p / q with q ~ Exp(1), one
    ``exponential_`` over the whole tensor), so indices and the generator's state afterwards match
    torch.multinomial on the same generator. Unlike it, nothing checks that ``probs`` is a valid
    distribution (torch up to about 2.4 read the check back to the host, later ones assert on the
    device), so nothing can stall or abort the step: a row of nan yields some index, not an error.
    """
    race = torch.empty_like(probs).exponential_(1, generator=generator)
    return torch.argmax(probs / race, dim=-1, keepdim=True)


def hf_sample(
    scores: torch.Tensor,
    input_ids: torch.Tensor,
    prompt_length: int,
    params: SamplingParams,
    generator: torch.Generator | None,
    *,
    padding: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next token per row [B], as one step of upstream ``_sample`` picks it.

    Greedy decoding draws nothing from ``generator`` (it may be None); sampling draws B x V
    numbers each step, for finished rows too, as upstream does. Replacing finished rows' tokens
    by the pad id stays with the caller, which owns which rows are finished.
    """
    processed = hf_process(scores, input_ids, prompt_length, params, padding=padding)
    if not params.do_sample:
        return torch.argmax(processed, dim=-1)
    if generator is None:  # never the process-wide generator
        raise ValueError("hf_sample: sampling needs the request's generator, got None")
    probs = torch.nn.functional.softmax(processed, dim=-1)
    return multinomial1(probs, generator).squeeze(1)
