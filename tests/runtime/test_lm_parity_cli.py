"""The parity harness CLI reproduces transformers on a save_pretrained directory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from mizuoto_runtime.lm.parity import main

IDS = [5, 17, 3, 44, 8, 21]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("qwen3")
    config = Qwen3Config(
        vocab_size=90,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        Qwen3ForCausalLM(config).save_pretrained(directory)
    return directory


def harness(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def upstream(model_dir: Path, dtype: torch.dtype, seed: int, **kwargs):
    model = Qwen3ForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    ids = torch.tensor([IDS])
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(seed)
        out = model.generate(
            ids,
            disable_compile=True,
            return_dict_in_generate=True,
            output_logits=True,
            **kwargs,
        )
        logits = model(ids).logits[0].float()
    return out, logits


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_sampled_run_and_logits_match_transformers(tmp_path, capsys, model_dir, dtype):
    prompt_file, steps_file = tmp_path / "prompt.npy", tmp_path / "steps.npy"
    result = harness(
        capsys,
        *("--model-dir", str(model_dir), "--input-ids", ",".join(map(str, IDS))),
        *("--dtype", dtype, "--max-new-tokens", "10", "--do-sample", "--seed", "42"),
        *("--temperature", "0.8", "--top-k", "30", "--top-p", "0.95", "--min-p", "0.01"),
        *("--repetition-penalty", "1.1", "--min-new-tokens", "4", "--eos-token-id", "7"),
        *("--logits-out", str(prompt_file), "--step-logits-out", str(steps_file)),
    )
    out, logits = upstream(
        model_dir,
        getattr(torch, dtype),
        42,
        max_new_tokens=10,
        do_sample=True,
        temperature=0.8,
        top_k=30,
        top_p=0.95,
        min_p=0.01,
        repetition_penalty=1.1,
        min_new_tokens=4,
        eos_token_id=7,
    )
    assert result["sequence"] == out.sequences[0].tolist()
    assert result["tokens"] == out.sequences[0, len(IDS) :].tolist()
    assert np.array_equal(np.load(prompt_file), logits.numpy())
    steps = np.load(steps_file)
    assert steps.shape == (len(out.logits), 90) and steps.dtype == np.float32
    assert np.array_equal(steps, torch.cat(out.logits).numpy())
    assert result["sampling"]["eos_token_id"] == [7] and result["kv_cache"] == "dynamic"


def test_static_cache_greedy_run(capsys, model_dir):
    result = harness(
        capsys,
        *("--model-dir", str(model_dir), "--input-ids", ",".join(map(str, IDS))),
        *("--kv-cache", "static", "--max-new-tokens", "6"),
    )
    out, _ = upstream(
        model_dir,
        torch.float32,
        0,
        max_new_tokens=6,
        do_sample=False,
        cache_implementation="static",
    )
    assert result["sequence"] == out.sequences[0].tolist()
    assert result["applied"]["kv_cache"] == "static"


def test_generation_config_supplies_unset_flags(tmp_path, capsys):
    config = Qwen2Config(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(1)
        model = Qwen2ForCausalLM(config)
    model.generation_config.do_sample = True
    model.generation_config.top_k = 5
    model.save_pretrained(tmp_path)
    result = harness(capsys, "--model-dir", str(tmp_path), "--input-ids", "1,2,3", "--seed", "9")
    assert result["sampling"]["do_sample"] is True and result["sampling"]["top_k"] == 5
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(9)
        expected = model.eval().generate(torch.tensor([[1, 2, 3]]), max_new_tokens=16)
    assert result["sequence"] == expected[0].tolist()


def test_a_llama_checkpoint_runs_as_transformers_runs_it(tmp_path, capsys):
    config = LlamaConfig(
        vocab_size=60,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mlp_bias=True,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        max_position_embeddings=64,
    )
    with torch.random.fork_rng():
        torch.manual_seed(2)
        model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path)
    argv = ("--model-dir", str(tmp_path), "--input-ids", "4,9,2,33", "--seed", "5")
    result = harness(capsys, *argv, "--do-sample", "--top-k", "20", "--max-new-tokens", "8")
    with torch.random.fork_rng(), torch.no_grad():
        torch.manual_seed(5)
        expected = model.generate(
            torch.tensor([[4, 9, 2, 33]]), do_sample=True, top_k=20, max_new_tokens=8
        )
    assert result["model_type"] == "llama"
    assert result["sequence"] == expected[0].tolist()


def test_an_unsupported_checkpoint_is_a_json_error(tmp_path, capsys):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma"}))
    assert main(["--model-dir", str(tmp_path), "--input-ids", "1", "--json"]) == 2
    error = json.loads(capsys.readouterr().out)
    assert error["error"] == "UnsupportedModel" and "model_type" in error["message"]


def test_runs_as_a_module(model_dir):
    command = [sys.executable, "-m", "mizuoto_runtime.lm.parity", "--model-dir", str(model_dir)]
    completed = subprocess.run(
        [*command, "--input-ids", "1,2,3", "--max-new-tokens", "3", "--json"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    result = json.loads(completed.stdout)
    assert result["input_ids"] == [1, 2, 3] and len(result["tokens"]) == 3
