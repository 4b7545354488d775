"""Entry point module: declares the engine without importing it (or torch)."""

from mizuoto_engine_codeclm.params import PARAMS
from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        EngineManifest(
            id="codeclm",
            name="Codec LM (tiny)",
            implementation="mizuoto_engine_codeclm.engine:CodecLMEngine",
            models=[
                ModelEntry(
                    "tiny",
                    files="mizuoto_engine_codeclm:weights",
                    description="4-layer Qwen3 decoder and a 24 kHz codec; untrained weights",
                )
            ],
            capabilities=["synthesize", "prepare_voice"],
            devices=["cpu", "cuda", "mps", "xpu"],
            dtypes=["bf16", "fp16", "fp32"],
            stochastic=True,
            params=PARAMS,
            parallel_domains=("dense", "attention"),
            description=(
                "Text bytes -> codec tokens from a Qwen3 decoder -> audio from a causal "
                "convolutional codec, streamed; a reference for neural engine authors."
            ),
        )
    ]
