"""CausalDecoder split over two real gloo ranks (attention and dense TP = 2) against one rank.

One spawn of two processes serves every assertion: each rank loads the same full checkpoint
(Qwen2 with q/k/v biases, Qwen3 with q/k norms and an o_proj bias, Llama with MLP biases, the
row-parallel down_proj's added once after the sum), runs the single-rank model
and the TP model on the same prompt, twice, and saves what it saw; the tests compare the records.
Greedy tokens must be equal; logits differ only by the order the all-reduce sums partial
products in (``LOGITS_ATOL``; 3.6e-7 at worst on these models); repeated TP runs are equal
bit for bit. The layers are checked on their own against a full nn.Linear / nn.Embedding.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import save_file
from torch import nn

from mizuoto_runtime.context import RequestContext
from mizuoto_runtime.lm import QwenConfig, QwenDecoder, generate
from mizuoto_runtime.lm.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    shard,
    shard_state_dict,
)
from mizuoto_runtime.ops import init_random
from mizuoto_runtime.parallel import Groups
from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.parallel import AttentionParallelConfig, DenseParallelConfig, ParallelConfig

LOGITS_ATOL = 1e-5  # float32; measured worst case 3.6e-7 (printed with -s)
VOCAB = 97  # prime: the vocabulary-parallel embedding splits it unevenly (49 + 48)
BASE = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}
FAMILIES = {
    "qwen2": {**BASE, "model_type": "qwen2"},
    "qwen3": {**BASE, "model_type": "qwen3", "head_dim": 16, "attention_bias": True},
    "llama": {**BASE, "model_type": "llama", "attention_bias": True, "mlp_bias": True},
}
TP2 = ParallelConfig(
    dense=DenseParallelConfig(tp_size=2), attention=AttentionParallelConfig(tp_size=2)
)


def _checkpoint(directory: Path, raw: dict, seed: int) -> Path:
    """A random full checkpoint as save_pretrained lays it out (config.json + safetensors)."""
    model = init_random(QwenDecoder(QwenConfig.from_dict(raw)), torch.Generator().manual_seed(seed))
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(raw))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items()}, directory / "model.safetensors"
    )
    return directory


def _prompt() -> torch.Tensor:
    return torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(1))


def _run(model: QwenDecoder, kind: str) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.inference_mode(), RequestContext(settings={"compute.kv_cache": kind}).bind():
        out = generate(model, _prompt(), max_new_tokens=8, output_logits=True)
    return out.new_tokens, out.logits


def _layers(groups: Groups) -> dict[str, torch.Tensor]:
    """Each parallel layer and the full layer it splits, from the same full weights."""
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(3, 5, 32, generator=gen), torch.randn(3, 5, 48, generator=gen)
    full = init_random(nn.Linear(32, 48, bias=True), gen)
    column = ColumnParallelLinear(32, 48, groups=groups, bias=True, gather_output=True)
    row = RowParallelLinear(48, 32, groups=groups, bias=True)
    row_full = init_random(nn.Linear(48, 32, bias=True), gen)
    embedding = VocabParallelEmbedding(VOCAB, 16, groups=groups)
    embedding_full = init_random(nn.Embedding(VOCAB, 16), gen)
    for layer, source in ((column, full), (row, row_full), (embedding, embedding_full)):
        layer.load_state_dict(shard_state_dict(layer, source.state_dict()))
    ids = torch.arange(VOCAB).reshape(1, VOCAB)
    with torch.no_grad():
        return {
            "column": column(x) - full(x),
            "row": row(shard(y, -1, groups, "dense_tp")) - row_full(y),  # y's slice: this rank's
            "embedding_equal": torch.tensor(torch.equal(embedding(ids), embedding_full(ids))),
        }


def _rank_main(rank: int, init_method: str, root: str) -> None:
    groups = Groups.start(TP2.layout(), rank, init_method=init_method, timeout=30.0)
    record: dict[str, object] = {}
    try:
        for family in FAMILIES:
            model_dir = Path(root, family)
            single = QwenDecoder.from_pretrained(model_dir)
            split = QwenDecoder.from_pretrained(model_dir, parallel=groups)
            for kind in ("dynamic", "static"):
                started = time.perf_counter()
                record[f"{family}.{kind}.single"] = _run(single, kind)
                groups.barrier()  # the TP timing starts with both ranks ready
                middle = time.perf_counter()
                record[f"{family}.{kind}.tp"] = _run(split, kind)
                record[f"{family}.{kind}.tp_again"] = _run(split, kind)
                end = time.perf_counter()
                record[f"{family}.{kind}.seconds"] = (middle - started, (end - middle) / 2)
            record[f"{family}.parameters"] = sum(p.numel() for p in split.parameters())
            record[f"{family}.parameters_single"] = sum(p.numel() for p in single.parameters())
        record["layers"] = _layers(groups)
    finally:
        groups.close()
    torch.save(record, Path(root, f"rank{rank}.pt"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def ranks(tmp_path_factory) -> list[dict]:
    root = tmp_path_factory.mktemp("tp")
    for seed, (family, raw) in enumerate(FAMILIES.items()):
        _checkpoint(root / family, raw, seed)
    init_method = f"tcp://127.0.0.1:{_free_port()}"
    context = mp.spawn(_rank_main, args=(init_method, str(root)), nprocs=2, join=False)
    deadline = time.monotonic() + 120
    while not context.join(timeout=max(deadline - time.monotonic(), 0.1)):
        if time.monotonic() > deadline:
            for process in context.processes:
                process.kill()
            pytest.fail("the 2 ranks did not finish within 120 s")
    return [torch.load(root / f"rank{rank}.pt") for rank in range(2)]


CASES = [(family, kind) for family in FAMILIES for kind in ("dynamic", "static")]


@pytest.mark.parametrize(("family", "kind"), CASES)
def test_greedy_tokens_with_tp_equal_the_single_rank_tokens(ranks, family, kind):
    for record in ranks:
        single, _ = record[f"{family}.{kind}.single"]
        tokens, _ = record[f"{family}.{kind}.tp"]
        assert torch.equal(tokens, single)


@pytest.mark.parametrize(("family", "kind"), CASES)
def test_tp_logits_are_within_the_documented_tolerance(ranks, family, kind):
    for record in ranks:
        _, single = record[f"{family}.{kind}.single"]
        _, logits = record[f"{family}.{kind}.tp"]
        worst = float((logits - single).abs().max())
        seconds = record[f"{family}.{kind}.seconds"]
        print(f"{family} {kind}: max |TP - single| = {worst:.3g}; single, TP s: {seconds}")
        assert worst <= LOGITS_ATOL


@pytest.mark.parametrize(("family", "kind"), CASES)
def test_repeated_tp_runs_are_bitwise_equal_and_every_rank_agrees(ranks, family, kind):
    first = ranks[0][f"{family}.{kind}.tp"]
    for record in ranks:
        for key in ("tp", "tp_again"):
            tokens, logits = record[f"{family}.{kind}.{key}"]
            assert torch.equal(tokens, first[0]) and torch.equal(logits, first[1])


@pytest.mark.parametrize("family", FAMILIES)
def test_each_rank_holds_about_half_the_layer_weights(ranks, family):
    raw = FAMILIES[family]
    replicated = 2 * raw["vocab_size"] * raw["hidden_size"]  # embedding and lm_head stay whole
    for record in ranks:
        split, whole = record[f"{family}.parameters"], record[f"{family}.parameters_single"]
        assert (split - replicated) < 0.6 * (whole - replicated)


def test_parallel_layers_equal_the_full_layers(ranks):
    for record in ranks:
        layers = record["layers"]
        assert float(layers["column"].abs().max()) <= 1e-5
        assert float(layers["row"].abs().max()) <= 1e-5
        assert bool(layers["embedding_equal"])


class _Split:
    """Groups of ``size`` ranks for every name, this being rank 0 (no collective is run)."""

    def __init__(self, size: int) -> None:
        self._size = size

    def rank(self, group: str = "world") -> int:
        return 0

    def size(self, group: str = "world") -> int:
        return self._size

    def all_reduce(self, tensor: torch.Tensor, group: str = "world") -> torch.Tensor:
        raise AssertionError("no collective is expected here")

    def all_gather(self, tensor: torch.Tensor, group: str = "world", dim: int = -1) -> torch.Tensor:
        raise AssertionError("no collective is expected here")


def test_an_indivisible_head_count_is_refused_naming_the_counts():
    config = QwenConfig.from_dict(FAMILIES["qwen2"])  # 4 heads, 2 key/value heads
    with pytest.raises(InvalidRequest) as refused:
        QwenDecoder(config, parallel=_Split(4))
    message = str(refused.value)
    assert "attention.tp_size=4" in message
    assert "num_attention_heads=4" in message and "num_key_value_heads=2" in message
    assert refused.value.detail["field"] == "parallel.attention.tp_size"


def test_a_full_checkpoint_of_another_shape_is_refused_naming_the_key():
    config = QwenConfig.from_dict(FAMILIES["qwen2"])
    split = QwenDecoder(config, parallel=_Split(2))
    state = dict(QwenDecoder(config).state_dict())
    key = "model.layers.0.mlp.down_proj.weight"
    state[key] = state[key][:, :10]
    with pytest.raises(InvalidRequest, match=key):
        shard_state_dict(split, state)


def test_single_groups_build_the_plain_decoder_bit_for_bit():
    config = QwenConfig.from_dict(FAMILIES["qwen3"])
    plain = init_random(QwenDecoder(config), torch.Generator().manual_seed(0)).eval()
    single = QwenDecoder(config, parallel=Groups.single()).eval()
    single.load_state_dict(plain.state_dict())
    assert [type(m) for m in single.modules()] == [type(m) for m in plain.modules()]
    with torch.inference_mode():
        assert torch.equal(single(_prompt()), plain(_prompt()))
