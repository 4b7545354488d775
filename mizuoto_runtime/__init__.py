"""Building blocks engines are made of. Importing this package never imports torch.

What an engine imports comes from here, ``from mizuoto_runtime import QwenDecoder, load_into``,
and nothing else is promised: the modules behind these names may move, these names stay. Each
name is resolved on first use (PEP 562), so importing the package costs nothing and torch waits
until a name that needs it is used. ``dir(mizuoto_runtime)`` lists them all.

- the call: ``RequestContext``, ``current_context``, ``Runtime`` (what ``Engine.load`` is given)
- devices: ``DeviceService``, ``DeviceProperties``, ``pick_dtype``, ``is_oom``
- memory: ``ModelHandle``, a model the memory manager may place, release and stream
- layers: ``ops`` (layers that cost nothing to construct), ``init_random``
- weights: ``load_state_dict``, ``load_into``, ``strip_prefix``, ``replace_prefixes``,
  ``fold_weight_norm``, ``LoadError``, ``CheckpointError``
- attention: ``accel``, ``attention``, ``Site`` (upstream's computation by default)
- sampling: ``SamplingParams``, ``InvalidSamplingParams``, ``hf_sample``, ``hf_process``,
  ``multinomial1``, all on the request's generator
- decoders: ``lm``, ``CausalDecoder``, ``DecoderConfig`` (Qwen2, Qwen3, Llama; ``QwenDecoder``
  and ``QwenConfig`` are the same classes), ``BufferCache``, ``DynamicCache``,
  ``mask_for``, ``decode`` (the decode loop, step by step), ``generate``, ``peak_bytes``
- acceleration: ``Graphs``, ``DecoderSteps``, ``LayerSteps``, ``compile_module``, ``Compiled``
- files and audio: ``load_onnx``, ``resample``, ``find_voice``, ``voice_roots``
- signal processing and text, loaded on first use: ``dsp`` (mel spectrograms, fbank, STFT,
  resampling equal to librosa, Whisper, HiFi-GAN and Kaldi), ``text`` (tokenizers, normalisation,
  sentences; never imports torch), ``nn`` (codecs, vocoders, speech encoders from Hub folders)
- child processes killed on cancel and with their owner: ``open_process``, ``run_process``,
  ``kill_children``
- several ranks: ``Groups`` (named process groups), and ``ColumnParallelLinear``,
  ``RowParallelLinear``, ``VocabParallelEmbedding``, ``shard_state_dict`` (tensor parallelism)
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from mizuoto_runtime import _moved

_moved.install()

if TYPE_CHECKING:
    from mizuoto_runtime import accel, dsp, lm, nn, ops, text
    from mizuoto_runtime.accel import Site, attention
    from mizuoto_runtime.accel.compile import Compiled, compile_module
    from mizuoto_runtime.accel.graphs import Graphs
    from mizuoto_runtime.context import RequestContext, current_context
    from mizuoto_runtime.convert.onnx import load_onnx
    from mizuoto_runtime.devices.device import DeviceService, is_oom
    from mizuoto_runtime.devices.dtypes import DeviceProperties, pick_dtype
    from mizuoto_runtime.dsp.resample import resample
    from mizuoto_runtime.lm import (
        BufferCache,
        CausalDecoder,
        DecoderConfig,
        DynamicCache,
        QwenConfig,
        QwenDecoder,
        mask_for,
    )
    from mizuoto_runtime.lm.decoding import decode
    from mizuoto_runtime.lm.generate import generate
    from mizuoto_runtime.lm.memory import peak_bytes
    from mizuoto_runtime.lm.steps import DecoderSteps, LayerSteps
    from mizuoto_runtime.lm.tensor_parallel import (
        ColumnParallelLinear,
        RowParallelLinear,
        VocabParallelEmbedding,
        shard_state_dict,
    )
    from mizuoto_runtime.memory.handle import ModelHandle
    from mizuoto_runtime.ops import init_random
    from mizuoto_runtime.parallel import Groups
    from mizuoto_runtime.process import kill_children, open_process, run_process
    from mizuoto_runtime.runtime import Runtime
    from mizuoto_runtime.sampling import (
        InvalidSamplingParams,
        SamplingParams,
        hf_process,
        hf_sample,
        multinomial1,
    )
    from mizuoto_runtime.voices import find_voice, voice_roots
    from mizuoto_runtime.weights.checkpoint import CheckpointError, load_state_dict
    from mizuoto_runtime.weights.loading import (
        LoadError,
        fold_weight_norm,
        load_into,
        replace_prefixes,
        strip_prefix,
    )

# name -> the module that defines it; a module's own name maps to itself (a subpackage).
_WHERE = {
    "RequestContext": "mizuoto_runtime.context",
    "current_context": "mizuoto_runtime.context",
    "Runtime": "mizuoto_runtime.runtime",
    "DeviceService": "mizuoto_runtime.devices.device",
    "is_oom": "mizuoto_runtime.devices.device",
    "DeviceProperties": "mizuoto_runtime.devices.dtypes",
    "pick_dtype": "mizuoto_runtime.devices.dtypes",
    "ModelHandle": "mizuoto_runtime.memory.handle",
    "ops": "mizuoto_runtime.ops",
    "dsp": "mizuoto_runtime.dsp",
    "nn": "mizuoto_runtime.nn",
    "text": "mizuoto_runtime.text",
    "init_random": "mizuoto_runtime.ops",
    "load_state_dict": "mizuoto_runtime.weights.checkpoint",
    "CheckpointError": "mizuoto_runtime.weights.checkpoint",
    "load_into": "mizuoto_runtime.weights.loading",
    "strip_prefix": "mizuoto_runtime.weights.loading",
    "replace_prefixes": "mizuoto_runtime.weights.loading",
    "fold_weight_norm": "mizuoto_runtime.weights.loading",
    "LoadError": "mizuoto_runtime.weights.loading",
    "accel": "mizuoto_runtime.accel",
    "attention": "mizuoto_runtime.accel",
    "Site": "mizuoto_runtime.accel",
    "SamplingParams": "mizuoto_runtime.sampling",
    "InvalidSamplingParams": "mizuoto_runtime.sampling",
    "hf_sample": "mizuoto_runtime.sampling",
    "hf_process": "mizuoto_runtime.sampling",
    "multinomial1": "mizuoto_runtime.sampling",
    "lm": "mizuoto_runtime.lm",
    "CausalDecoder": "mizuoto_runtime.lm",
    "DecoderConfig": "mizuoto_runtime.lm",
    "QwenConfig": "mizuoto_runtime.lm",
    "QwenDecoder": "mizuoto_runtime.lm",
    "BufferCache": "mizuoto_runtime.lm",
    "DynamicCache": "mizuoto_runtime.lm",
    "mask_for": "mizuoto_runtime.lm",
    "decode": "mizuoto_runtime.lm",
    "generate": "mizuoto_runtime.lm",
    "peak_bytes": "mizuoto_runtime.lm.memory",
    "Graphs": "mizuoto_runtime.accel.graphs",
    "DecoderSteps": "mizuoto_runtime.lm.steps",
    "LayerSteps": "mizuoto_runtime.lm.steps",
    "compile_module": "mizuoto_runtime.accel.compile",
    "Compiled": "mizuoto_runtime.accel.compile",
    "load_onnx": "mizuoto_runtime.convert.onnx",
    "resample": "mizuoto_runtime.dsp.resample",
    "find_voice": "mizuoto_runtime.voices",
    "voice_roots": "mizuoto_runtime.voices",
    "Groups": "mizuoto_runtime.parallel",
    "ColumnParallelLinear": "mizuoto_runtime.lm.tensor_parallel",
    "RowParallelLinear": "mizuoto_runtime.lm.tensor_parallel",
    "VocabParallelEmbedding": "mizuoto_runtime.lm.tensor_parallel",
    "shard_state_dict": "mizuoto_runtime.lm.tensor_parallel",
    "open_process": "mizuoto_runtime.process",
    "kill_children": "mizuoto_runtime.process",
    "run_process": "mizuoto_runtime.process",
}

__all__ = [
    "BufferCache",
    "CausalDecoder",
    "CheckpointError",
    "ColumnParallelLinear",
    "Compiled",
    "DecoderConfig",
    "DecoderSteps",
    "DeviceProperties",
    "DeviceService",
    "DynamicCache",
    "Graphs",
    "Groups",
    "InvalidSamplingParams",
    "LayerSteps",
    "LoadError",
    "ModelHandle",
    "QwenConfig",
    "QwenDecoder",
    "RequestContext",
    "RowParallelLinear",
    "Runtime",
    "SamplingParams",
    "Site",
    "VocabParallelEmbedding",
    "accel",
    "attention",
    "compile_module",
    "current_context",
    "decode",
    "dsp",
    "find_voice",
    "fold_weight_norm",
    "generate",
    "hf_process",
    "hf_sample",
    "init_random",
    "is_oom",
    "kill_children",
    "lm",
    "load_into",
    "load_onnx",
    "load_state_dict",
    "mask_for",
    "multinomial1",
    "nn",
    "open_process",
    "ops",
    "peak_bytes",
    "pick_dtype",
    "replace_prefixes",
    "resample",
    "run_process",
    "shard_state_dict",
    "strip_prefix",
    "text",
    "voice_roots",
]


# Type checkers read the names imported under TYPE_CHECKING above; a module __getattr__
# would make every misspelt name type-check, so they never see it.
if not TYPE_CHECKING:

    def __getattr__(name: str) -> object:
        """Import the module behind ``name`` on first use (PEP 562) and keep the value here."""
        where = _WHERE.get(name)
        if where is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        module = importlib.import_module(where)
        value = module if where == f"{__name__}.{name}" else getattr(module, name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
