"""Entry point module: declares the engine without importing it (or torch)."""

from mizuoto_engine_csm.params import PARAMS
from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

# What a folder of the user's (engines.csm.model_dir) must hold: a save_pretrained checkpoint
# and its processor's tokenizer and chat template.
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
)


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        EngineManifest(
            id="csm",
            name="Sesame CSM",
            implementation="mizuoto_engine_csm.engine:CsmEngine",
            models=[
                ModelEntry(
                    "tiny",
                    files="mizuoto_engine_csm:weights",
                    description="a random 2-layer CSM with a 4-codebook Mimi; untrained",
                    required_files=REQUIRED_FILES,
                )
            ],
            capabilities=["synthesize", "prepare_voice"],
            devices=["cpu", "cuda"],
            dtypes=["fp32", "bf16"],
            stochastic=True,
            params=PARAMS,
            description=(
                "Sesame's Conversational Speech Model as transformers runs it: a Llama backbone "
                "writes each frame's first Mimi code, a depth decoder the rest; the same audio "
                "as CsmForConditionalGeneration.generate for the same seed, streamed."
            ),
        )
    ]
