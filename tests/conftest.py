"""Fixtures that install real fixture distributions (dist-info + entry points) on sys.path."""

from __future__ import annotations

import sys
import textwrap
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace

import pytest

from mizuoto_sdk.host import Discovery

MakeDist = Callable[..., Path]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``cuda`` skip cleanly on machines without a CUDA device."""
    marked = [item for item in items if "cuda" in item.keywords]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh site directory on sys.path; modules imported from it are forgotten afterwards."""
    directory = tmp_path / "site"
    directory.mkdir()
    monkeypatch.syspath_prepend(str(directory))
    before = set(sys.modules)
    yield directory
    for name in set(sys.modules) - before:
        module = sys.modules.get(name)
        if str(getattr(module, "__file__", "") or "").startswith(str(directory)):
            del sys.modules[name]


@pytest.fixture
def unique() -> Callable[[str], str]:
    """Module names unique to one test, so sys.modules never serves another test's module."""
    token = uuid.uuid4().hex[:8]
    return lambda name: f"{name}_{token}"


@pytest.fixture
def make_dist(site: Path) -> MakeDist:
    """Write a distribution: its modules and a dist-info with ``mizuoto.engines`` entry points."""

    def make(
        name: str,
        modules: Mapping[str, str],
        entry_points: Mapping[str, str],
        version: str = "1.0",
    ) -> Path:
        for module, source in modules.items():
            path = site / (module.replace(".", "/") + ".py")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(textwrap.dedent(source))
        info = site / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = "".join(f"{key} = {value}\n" for key, value in entry_points.items())
        (info / "entry_points.txt").write_text(f"[mizuoto.engines]\n{lines}")
        return site

    return make


def plugin_source(arguments: str) -> str:
    """A plugin module whose hook returns ``[EngineManifest(<arguments>)]``."""
    return f"""
        from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

        @hookimpl
        def mizuoto_engines():
            return [EngineManifest({arguments})]
    """


def manifest_arguments(engine_id: str, implementation: str, extra: str = "") -> str:
    """Keyword arguments for a typical manifest: models a, b, c; three capabilities."""
    return (
        f"id={engine_id!r}, implementation={implementation!r}, "
        "models=[ModelEntry('a'), ModelEntry('b'), ModelEntry('c')], "
        "capabilities=['synthesize', 'prepare_voice', 'call']" + (f", {extra}" if extra else "")
    )


# A configurable engine for the host tests: params["mode"] picks a behaviour, EVENTS records
# what the engine saw (in order), so tests can assert laziness, cleanup, modes and threads.
HOST_ENGINE = """
    import sys
    import threading
    import time

    import numpy as np

    from mizuoto_runtime.context import current_context
    from mizuoto_sdk import AudioChunk, Engine, InvalidRequest, LoadedEngine

    EVENTS = []

    def _state(label):
        import torch
        EVENTS.append((label, torch.is_inference_mode_enabled(), current_context() is not None,
                       threading.get_ident()))

    class HostEngine(Engine):
        DEVICES = ("cpu",)

        def load(self, spec, runtime, ctx):
            _state("load")
            if spec.options.get("fail_load"):
                raise ValueError("load failed on purpose")
            if spec.options.get("exit_load"):
                sys.exit(4)
            return Loaded(spec)

    class Loaded(LoadedEngine):
        def __init__(self, spec):
            self.spec = spec

        def describe(self):
            return {"model": self.spec.model_id}

        def unload(self):
            EVENTS.append(("unload", self.spec.model_id))

        def synthesize(self, text, params, ctx):
            _state("start")
            mode = params.get("mode", "tones")
            try:
                for index in range(int(params.get("chunks", 3))):
                    if mode == "slow":
                        ctx.check_cancel()
                        time.sleep(0.005)
                        yield AudioChunk(np.zeros(160), 16000)
                        continue
                    if mode == "ignore_cancel":
                        time.sleep(0.03)
                    if mode == "raise":
                        raise ValueError("broken on purpose")
                    if mode == "exit":
                        sys.exit(3)
                    if mode == "oom":
                        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
                    if mode == "invalid":
                        raise InvalidRequest("params.mode: bad", {"field": "params.mode"})
                    if mode == "bad_chunk":
                        yield [0.0, 0.1]
                    elif mode == "rate_change":
                        yield AudioChunk(np.zeros(10, np.float32), 16000 + index)
                    elif mode == "torch":
                        import torch
                        yield AudioChunk(torch.full((2, 8), 0.5, dtype=torch.bfloat16), 8000)
                    else:
                        stereo = np.stack([np.full(4, index, np.float64),
                                           np.full(4, index + 1, np.float64)])
                        yield AudioChunk(stereo, 16000, {"index": index})
                    _state(f"chunk{index}")
                    ctx.progress(index + 1, 3)
            finally:
                EVENTS.append(("finally", mode))

        def prepare_voice(self, audio, voice_dir, params, ctx):
            (voice_dir / "embedding.npy").write_bytes(b"half")
            if params.get("mode") == "raise":
                raise ValueError("voice failed on purpose")
            return {"files": ["embedding.npy"]}

        def call(self, op, payload, ctx):
            _state("call")
            if op == "echo":
                return dict(payload, seed=ctx.seed)
            if op == "sleep":
                while True:
                    ctx.check_cancel()
                    time.sleep(0.005)
            return super().call(op, payload, ctx)
"""


@pytest.fixture
def host_engine(make_dist: MakeDist, unique: Callable[[str], str]) -> SimpleNamespace:
    """The HOST_ENGINE installed as distribution ``host-engines``, found through its entry point."""
    engine_module, plugin_module = unique("hostengine"), unique("hostplugin")
    site = make_dist(
        "host-engines",
        {
            engine_module: HOST_ENGINE,
            plugin_module: plugin_source(
                manifest_arguments("hosted", f"{engine_module}:HostEngine", "devices=['cpu']")
            ),
        },
        {"hosted": plugin_module},
    )
    discovery = Discovery(path=[str(site)], selection=None)
    module = __import__(engine_module)
    return SimpleNamespace(
        discovery=discovery, events=module.EVENTS, engine_id="hosted", module=module
    )
