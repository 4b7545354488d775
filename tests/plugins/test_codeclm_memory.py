"""codeclm under a VRAM budget that forces its decoder to stream: the same audio, bit for bit."""

from __future__ import annotations

import threading

import numpy as np
import torch

from mizuoto_sdk.host import EngineRequest, RuntimeService

TEXT = "Hello from Mizuoto"


def synthesized(service: RuntimeService, **params) -> np.ndarray:
    request = EngineRequest(params={"max_frames": 24, "seed": 5, **params})
    handle = service.load("codeclm")
    return np.concatenate([c.samples for c in handle.synthesize(TEXT, request)])


def test_a_streamed_decoder_speaks_exactly_as_the_resident_one():
    resident = synthesized(RuntimeService())
    service = RuntimeService({"compute.simulate_vram_mb": 4})
    streamed = synthesized(service)
    (row,) = service.describe_models()
    decoder = next(c for c in row["components"] if c["name"] == "codeclm/tiny:decoder")
    assert decoder["streamed_bytes"] > 0  # some layers did not fit and were streamed
    assert row["resident_bytes"] <= 4 * 2**20
    assert np.array_equal(streamed, resident)


def test_a_released_codeclm_is_placed_again_and_speaks_the_same():
    service = RuntimeService({"compute.simulate_vram_mb": 16})
    first = synthesized(service)
    sine = service.load("sine")
    list(sine.synthesize("hi", EngineRequest(params={"seed": 1})))
    freed = service.release_idle("cpu")
    assert "codeclm/tiny:decoder" in freed
    (row,) = [m for m in service.describe_models() if m["engine"] == "codeclm"]
    assert row["resident_bytes"] == 0 and row["host_bytes"] > 0
    assert np.array_equal(synthesized(service), first)


def test_threads_on_one_streamed_codeclm_speak_as_serial_calls_and_keep_its_weights():
    service = RuntimeService({"compute.simulate_vram_mb": 4})
    seeds = [5, 6, 7]
    serial = {seed: synthesized(service, seed=seed) for seed in seeds}
    (model,) = service.models()
    before = [
        {k: v.clone() for k, v in h.module.state_dict().items()}
        for h in model.loaded_engine.handles
    ]
    (row,) = service.describe_models()
    assert row["streamed_bytes"] > 0  # the decoder streams
    start = threading.Barrier(len(seeds))
    results: dict[int, np.ndarray] = {}
    errors: list[BaseException] = []

    def speak(seed: int) -> None:
        try:
            start.wait()
            results[seed] = synthesized(service, seed=seed)
        except BaseException as error:  # handed to the main thread
            errors.append(error)

    threads = [threading.Thread(target=speak, args=(seed,)) for seed in seeds]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, repr(errors[0])
    for seed in seeds:
        assert np.array_equal(results[seed], serial[seed]), seed
    for handle, weights in zip(model.loaded_engine.handles, before, strict=True):
        for name, tensor in handle.module.state_dict().items():
            assert torch.equal(tensor, weights[name]), name
    assert np.array_equal(synthesized(service, seed=5), serial[5])


def test_a_codeclm_handle_unloaded_before_its_call_loads_again_and_speaks_the_same():
    reference = synthesized(RuntimeService())
    service = RuntimeService({"compute.max_resident_models": 1})
    handle = service.load("codeclm")
    stream = handle.synthesize(TEXT, EngineRequest(params={"max_frames": 24, "seed": 5}))
    service.load("sine")  # codeclm was idle: unloaded to make room
    assert np.array_equal(np.concatenate([c.samples for c in stream]), reference)
