"""csm's shipped folder and its end frame, against transformers in the same process."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from mizuoto_sdk.host import EngineRequest, RuntimeService

transformers = pytest.importorskip("transformers")

HOP = 1920


def audio(handle, text, **params):
    request = EngineRequest(params=params)
    chunks = list(handle.synthesize(text, request))
    return np.concatenate([c.samples for c in chunks]), chunks, request


def test_the_weights_script_reproduces_the_shipped_folder(tmp_path):
    from mizuoto_engine_csm.make_weights import WEIGHTS_DIR, write

    made = write(tmp_path)
    shipped = sorted(p.name for p in WEIGHTS_DIR.iterdir())
    assert sorted(p.name for p in made.iterdir()) == shipped
    for name in shipped:
        assert (made / name).read_bytes() == (WEIGHTS_DIR / name).read_bytes(), name
    assert sum((WEIGHTS_DIR / name).stat().st_size for name in shipped) < 2_000_000


def end_frame_folder(tmp_path):
    """The tiny checkpoint changed so that code 0 is likely in every codebook: the final norms
    keep one feature, which the embeddings make positive and the layers leave alone, and only
    code 0 reads it. Frames whose first K-1 codes are 0 (the end) then come within a few."""
    import torch
    from safetensors.torch import load_file, save_file

    from mizuoto_engine_csm.make_weights import WEIGHTS_DIR

    folder = tmp_path / "ending"
    shutil.copytree(WEIGHTS_DIR, folder)
    state = load_file(folder / "model.safetensors")
    with torch.no_grad():
        state["embed_text_tokens.weight"][:, 0] = 100
        state["depth_decoder.model.embed_tokens.weight"][:, 0] = 100
        for key, tensor in state.items():
            if key.endswith(("o_proj.weight", "down_proj.weight")):
                tensor[0] = 0
        for key in ("backbone_model.norm.weight", "depth_decoder.model.norm.weight"):
            state[key].zero_()[0] = 1
        state["lm_head.weight"][:, 0] = 0
        state["lm_head.weight"][0, 0] = 0.5
        state["depth_decoder.model.inputs_embeds_projector.weight"][0] = 0
        state["depth_decoder.model.inputs_embeds_projector.weight"][0, 0] = 1
        state["depth_decoder.codebooks_head.weight"][:, 0] = 0
        state["depth_decoder.codebooks_head.weight"][:, 0, 0] = 0.7
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    return folder


def test_the_end_frame_stops_as_generate_stops(tmp_path):
    folder = end_frame_folder(tmp_path)
    handle = RuntimeService({"engines.csm.model_dir": str(folder)}).load("csm")
    model = transformers.CsmForConditionalGeneration.from_pretrained(folder).eval()
    processor = transformers.CsmProcessor.from_pretrained(folder)
    conversation = [{"role": "0", "content": [{"type": "text", "text": "Hi"}]}]
    inputs = processor.apply_chat_template(conversation, tokenize=True, return_dict=True)
    # seed 2: the last frame ends with a code that is not 0, so it is audio; seed 15: all 0, not
    for seed, written, kept in ((2, 5, 5), (15, 4, 3)):
        with torch.random.fork_rng(), torch.no_grad():
            torch.manual_seed(seed)
            out = model.generate(
                **inputs, max_new_tokens=12, output_audio=True, return_dict_in_generate=True
            )
        assert out.sequences.shape[1] == written
        ours, _, request = audio(handle, "Hi", seed=seed, max_frames=12, chunk_frames=0)
        assert request.applied["csm"]["frames"] == kept
        assert torch.equal(torch.from_numpy(ours), out.audio[0])
        if seed == 15:  # the stream drops the all-0 frame too
            streamed, _, _ = audio(handle, "Hi", seed=seed, max_frames=12, chunk_frames=4)
            assert len(streamed) == kept * HOP and np.abs(streamed - ours).max() <= 1e-4
