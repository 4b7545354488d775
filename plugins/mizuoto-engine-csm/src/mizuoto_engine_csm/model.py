"""CSM's networks, loaded from one ``save_pretrained`` folder, named as upstream names them.

``CsmForConditionalGeneration`` holds two Llama decoders and what joins them:

- the backbone (``backbone_model.*``): ``lm.CausalDecoder`` built without its embedding and head,
  fed ``inputs_embeds`` and read as final-norm hidden states;
- the depth decoder (``depth_decoder.model.*``): the same, smaller;
- ``CsmParts``: the text embedding, the audio embedding (one table of ``num_codebooks x vocab``
  rows, code k of codebook i at row ``i * vocab + k``, tied between the two decoders), the
  backbone's ``lm_head`` (codebook 0), the depth decoder's input projector and its
  ``codebooks_head`` (one ``[hidden, vocab]`` matrix per codebook 1..K-1);
- the Mimi codec (``codec_model.*``): ``mizuoto_runtime.nn.mimi``.

Every key of the checkpoint lands in exactly one of them, strictly: a missing, unexpected or
mis-shaped key is a ``LoadError`` (``EngineUnavailable``) naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TypedDict

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mizuoto_engine_csm.config import CsmConfig
from mizuoto_runtime import load_into, load_state_dict, ops
from mizuoto_runtime.lm import CausalDecoder, DecoderConfig
from mizuoto_runtime.nn import mimi
from mizuoto_runtime.nn.mimi import MimiCodec
from mizuoto_runtime.weights.loading import LoadError

BACKBONE = "backbone_model."
DEPTH = "depth_decoder.model."
CODEC = "codec_model."
_OWN_BY_PARTS = ("embed_tokens", "inputs_embeds_projector")  # under the two decoder prefixes


class _Placement(TypedDict):
    dtype: torch.dtype
    device: torch.device | str | None


class _AudioEmbeddings(nn.Module):
    def __init__(self, rows: int, hidden: int, kw: _Placement) -> None:
        super().__init__()
        self.embed_audio_tokens = ops.default.Embedding(rows, hidden, **kw)


class _BackboneParts(nn.Module):
    def __init__(self, rows: int, hidden: int, kw: _Placement) -> None:
        super().__init__()
        self.embed_tokens = _AudioEmbeddings(rows, hidden, kw)


class _DepthModelParts(nn.Module):
    def __init__(self, audio: nn.Embedding, hidden: int, depth_hidden: int, kw: _Placement) -> None:
        super().__init__()
        self.embed_tokens = audio  # tied: the same table as the backbone's
        self.inputs_embeds_projector = ops.default.Linear(hidden, depth_hidden, bias=False, **kw)


class CodebooksHead(nn.Module):
    """``CsmCodebooksHead``: ``weight[i]`` [hidden, vocab] scores codebook i + 1."""

    def __init__(self, codebooks: int, hidden: int, vocab: int, kw: _Placement) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(codebooks - 1, hidden, vocab, **kw))


class _DepthParts(nn.Module):
    def __init__(self, config: CsmConfig, audio: nn.Embedding, kw: _Placement) -> None:
        super().__init__()
        hidden, depth = config.backbone.hidden_size, config.depth.hidden_size
        self.model = _DepthModelParts(audio, hidden, depth, kw)
        self.codebooks_head = CodebooksHead(config.num_codebooks, depth, config.codebook_vocab, kw)


class CsmParts(nn.Module):
    """Everything of CSM but its two decoders' layers and its codec; names as the checkpoint's."""

    def __init__(
        self, config: CsmConfig, *, dtype: torch.dtype, device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        kw: _Placement = {"dtype": dtype, "device": device}
        hidden, vocab = config.backbone.hidden_size, config.codebook_vocab
        self.num_codebooks, self.vocab = config.num_codebooks, vocab
        self.embed_text_tokens = ops.default.Embedding(config.text_vocab_size, hidden, **kw)
        self.lm_head = ops.default.Linear(hidden, vocab, bias=False, **kw)
        self.backbone_model = _BackboneParts(config.num_codebooks * vocab, hidden, kw)
        audio = self.backbone_model.embed_tokens.embed_audio_tokens
        self.depth_decoder = _DepthParts(config, audio, kw)

    @property
    def audio_table(self) -> nn.Embedding:
        return self.backbone_model.embed_tokens.embed_audio_tokens

    def frame_embeds(self, codes: Tensor) -> Tensor:
        """codes [B, F, K] -> [B, F, hidden]: each frame's K code embeddings summed
        (``CsmBackboneModelEmbeddings``), codebook i's rows offset by ``i * vocab``."""
        offsets = torch.arange(self.num_codebooks, device=codes.device) * self.vocab
        return self.audio_table(codes + offsets).sum(dim=2)

    def depth_prefill(self, hidden: Tensor, first: Tensor) -> Tensor:
        """The depth decoder's first input [B, 2, depth hidden]: position 0 is the backbone's
        last hidden state [B, hidden], position 1 codebook 0's code ``first`` [B]."""
        ids = F.pad(first[:, None], (1, 0), value=0)  # [B, 2]: upstream's placeholder 0, then c0
        embeds = self.audio_table(ids)  # both at codebook 0's rows (offset clamp(p - 1, 0) = 0)
        embeds[:, 0] = hidden
        return self.depth_decoder.model.inputs_embeds_projector(embeds)

    def depth_step(self, code: Tensor, codebook: int) -> Tensor:
        """code [B] of ``codebook`` -> the depth decoder's next input [B, 1, depth hidden]."""
        embeds = self.audio_table((code + codebook * self.vocab)[:, None])  # [B, 1, hidden]
        return self.depth_decoder.model.inputs_embeds_projector(embeds)

    def codebook_logits(self, hidden: Tensor, codebook: int) -> Tensor:
        """hidden [B, 1, depth hidden] -> the logits [B, vocab] of ``codebook`` (1..K-1)."""
        weight = self.depth_decoder.codebooks_head.weight[codebook - 1]  # [depth hidden, vocab]
        return F.linear(hidden[:, 0, :], weight.T)  # upstream's transposed view, same kernel


class CsmNetworks:
    """The four loaded parts; each goes to the host in its own ModelHandle."""

    def __init__(
        self,
        config: CsmConfig,
        backbone: CausalDecoder,
        depth: CausalDecoder,
        parts: CsmParts,
        codec: MimiCodec,
    ) -> None:
        self.config, self.backbone, self.depth, self.parts, self.codec = (
            config,
            backbone,
            depth,
            parts,
            codec,
        )


def load_networks(
    folder: Path, config: CsmConfig, *, dtype: torch.dtype, device: str, name: str
) -> CsmNetworks:
    """The folder's model.safetensors split over the four parts, each loaded strictly."""
    state = load_state_dict(folder, device=device)
    backbone = _decoder(config.backbone, state, BACKBONE, ("embed_tokens",), dtype, device)
    depth = _decoder(config.depth, state, DEPTH, _OWN_BY_PARTS, dtype, device)
    codec_state = {k[len(CODEC) :]: v for k, v in state.items() if k.startswith(CODEC)}
    codec = mimi.build(config.codec, codec_state, device=device, dtype=dtype, name=f"{name}:codec")
    rest = {key: value for key, value in state.items() if _owned_by_parts(key)}
    with torch.device("meta"):
        parts = CsmParts(config, dtype=dtype)
    load_into(parts, rest, cast=True)
    return CsmNetworks(config, backbone, depth, parts.eval(), codec)


def _decoder(
    config: DecoderConfig,
    state: Mapping[str, Tensor],
    prefix: str,
    skip: tuple[str, ...],
    dtype: torch.dtype,
    device: str,
) -> CausalDecoder:
    """One decoder from the keys under ``prefix`` (``prefix`` + rest -> ``model.`` + rest), built
    where it runs: ``ops.default`` layers allocate without drawing, and building on "meta" would
    compute RoPE's frequencies through torch's reference ops, which import torch._dynamo."""
    ours = {}
    for key, tensor in state.items():
        rest = key[len(prefix) :]
        if key.startswith(prefix) and not any(
            rest == name or rest.startswith(name + ".") for name in skip
        ):
            ours["model." + rest] = tensor
    decoder = CausalDecoder(config, dtype=dtype, device=device, head=False, embed=False)
    try:
        load_into(decoder, ours, cast=True)
    except LoadError as error:
        raise LoadError(
            f"{prefix}* (as model.*): {error}", error.missing, error.unexpected, error.mismatched
        ) from None
    return decoder.eval()


def _owned_by_parts(key: str) -> bool:
    if key.startswith(CODEC):
        return False
    for prefix, own in ((BACKBONE, ("embed_tokens",)), (DEPTH, _OWN_BY_PARTS)):
        if key.startswith(prefix):
            rest = key[len(prefix) :]
            return any(rest == name or rest.startswith(name + ".") for name in own)
    return True
