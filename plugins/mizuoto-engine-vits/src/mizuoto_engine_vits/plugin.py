"""Entry point module: declares the engine without importing it (or torch)."""

from mizuoto_engine_vits.params import PARAMS
from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

REQUIRED_FILES = ("config.json", "model.safetensors", "vocab.json", "tokenizer_config.json")
"""What a folder must hold to stand in for a model (``engines.vits.model_dir``): a VITS folder
as the Hub ships MMS-TTS checkpoints."""


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        EngineManifest(
            id="vits",
            name="VITS / MMS-TTS",
            implementation="mizuoto_engine_vits.engine:VitsEngine",
            models=[
                ModelEntry(
                    "tiny",
                    files="mizuoto_engine_vits:weights",
                    description="a small VITS with English characters; untrained weights",
                    required_files=REQUIRED_FILES,
                )
            ],
            capabilities=["synthesize"],
            devices=["cpu", "cuda", "mps", "xpu"],
            dtypes=["fp32", "bf16", "fp16"],
            stochastic=True,
            text_input=True,
            params=PARAMS,
            description=(
                "transformers' VitsModel (MMS-TTS) rebuilt from mizuoto_runtime blocks: the "
                "same waveform for the same seed, streamed sentence by sentence."
            ),
        )
    ]
