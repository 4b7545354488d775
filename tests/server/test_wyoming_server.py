"""``mizuoto wyoming`` on a loopback port, asked by the ``wyoming`` package's own client."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from server_support import server_env, stop_server

from mizuoto_sdk.audio import pcm16
from mizuoto_sdk.cli import main
from mizuoto_sdk.host import EngineRequest, RuntimeService

pytest.importorskip("wyoming", reason="the Wyoming tests need the wyoming package")
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Describe, Info
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

START_TIMEOUT = 60.0
READ_TIMEOUT = 30.0


@dataclass
class Wyoming:
    host: str
    port: int
    log: Path  # the server's output
    witness_log: Path  # what the witness engine did
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def wyoming_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Wyoming]:
    """One ``mizuoto wyoming`` for this module: sine with a fixed seed, the witness engine held
    after its first chunk until its call is cancelled."""
    root = tmp_path_factory.mktemp("wyoming")
    settings = root / "settings.toml"
    settings.write_text("")
    env = server_env(root / "home", settings)
    witness_log = root / "witness.log"
    log = root / "wyoming.log"
    arguments = ["--uri", "tcp://127.0.0.1:0", "--param", "sine.seed=5"]
    for pair in (f"log={witness_log}", "hold_at=1", "chunks=3"):
        arguments += ["--param", f"witness.{pair}"]
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "mizuoto_sdk.cli", "wyoming", *arguments],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + START_TIMEOUT
    found = None
    while found is None and time.monotonic() < deadline and process.poll() is None:
        found = re.search(r"mizuoto wyoming at tcp://([\d.]+):(\d+)", log.read_text())
        time.sleep(0.05)  # polling another process's output; bounded by the deadline
    if found is None:
        stop_server(process)
        raise AssertionError(f"mizuoto wyoming did not start:\n{log.read_text()}")
    server = Wyoming(found[1], int(found[2]), log, witness_log, process)
    try:
        yield server
    finally:
        code = stop_server(process)
        assert code == 0, log.read_text()[-3000:]


def host_pcm(engine: str, text: str, params: dict[str, object]) -> bytes:
    with RuntimeService() as service:
        chunks = list(service.load(engine).synthesize(text, EngineRequest(params=dict(params))))
    return pcm16(np.concatenate([c.samples for c in chunks]))


async def exchange(server: Wyoming, *events: Event, until: str) -> list[Event]:
    """Send ``events``, then read every event up to the first of type ``until``."""
    async with AsyncTcpClient(server.host, server.port) as client:
        for event in events:
            await client.write_event(event)
        received = []
        while True:
            event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT)
            assert event is not None, "the server closed the connection"
            received.append(event)
            if event.type == until or Error.is_type(event.type):
                return received


def audio_of(events: list[Event]) -> list[bytes]:
    """The PCM of each audio-start ... audio-stop in ``events``, checking the format."""
    spoken: list[bytes] = []
    for event in events:
        if AudioStart.is_type(event.type):
            start = AudioStart.from_event(event)
            assert (start.width, start.channels) == (2, 1)
            spoken.append(b"")
        elif AudioChunk.is_type(event.type):
            spoken[-1] += AudioChunk.from_event(event).audio
    assert sum(AudioStop.is_type(e.type) for e in events) == len(spoken)
    return spoken


def test_describe_lists_one_program_per_engine_with_its_voices(wyoming_server: Wyoming) -> None:
    [event] = asyncio.run(exchange(wyoming_server, Describe().event(), until="info"))
    programs = {p.name: p for p in Info.from_event(event).tts}
    assert {"sine", "codeclm", "witness", "faulty"} <= set(programs)
    assert all(p.installed and p.supports_synthesize_streaming for p in programs.values())
    assert [v.name for v in programs["sine"].voices] == ["sine"]


def test_synthesize_streams_the_hosts_audio(wyoming_server: Wyoming) -> None:
    ask = Synthesize("hello wyoming", voice=SynthesizeVoice(name="sine")).event()
    events = asyncio.run(exchange(wyoming_server, ask, until="audio-stop"))
    assert AudioStart.from_event(events[0]).rate == 16000
    assert sum(AudioChunk.is_type(e.type) for e in events) > 1  # a chunk per engine chunk
    assert audio_of(events) == [host_pcm("sine", "hello wyoming", {"seed": 5})]


def test_streamed_text_feeds_one_call_then_stops(
    wyoming_server: Wyoming,
) -> None:
    voice = SynthesizeVoice(name="sine")
    pieces = ["Hello the", "re. How are", " you? Fine"]
    events = asyncio.run(
        exchange(
            wyoming_server,
            SynthesizeStart(voice=voice).event(),
            *(SynthesizeChunk(piece).event() for piece in pieces),
            Synthesize("".join(pieces), voice=voice).event(),  # Home Assistant's copy
            SynthesizeStop().event(),
            until="synthesize-stopped",
        )
    )
    assert SynthesizeStopped.is_type(events[-1].type)
    # sine declares text_input: one call fed the pieces, the joined text's audio
    assert audio_of(events) == [host_pcm("sine", "".join(pieces), {"seed": 5})]


def test_several_clients_at_once_each_get_their_own_audio(wyoming_server: Wyoming) -> None:
    texts = [f"client {n}" for n in range(4)]

    async def all_at_once() -> list[list[Event]]:
        asks = [Synthesize(t, voice=SynthesizeVoice(name="sine")).event() for t in texts]
        return list(
            await asyncio.gather(*(exchange(wyoming_server, a, until="audio-stop") for a in asks))
        )

    for text, events in zip(texts, asyncio.run(all_at_once()), strict=True):
        assert audio_of(events) == [host_pcm("sine", text, {"seed": 5})]


def test_a_client_that_leaves_mid_stream_stops_the_engine(wyoming_server: Wyoming) -> None:
    """The witness engine sends one chunk, then waits for a cancel only the disconnect sends."""

    async def leave_after_the_first_chunk() -> None:
        async with AsyncTcpClient(wyoming_server.host, wyoming_server.port) as client:
            await client.write_event(Synthesize("x", voice=SynthesizeVoice("witness")).event())
            for expected in (AudioStart, AudioChunk):
                event = await asyncio.wait_for(client.read_event(), READ_TIMEOUT)
                assert event is not None and expected.is_type(event.type)

    asyncio.run(leave_after_the_first_chunk())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and "finally" not in wyoming_server.witness_log.read_text():
        time.sleep(0.02)  # the engine's log, written by the server's process
    assert wyoming_server.witness_log.read_text().splitlines() == ["chunk 0", "finally"]


def test_a_bad_voice_is_an_error_event_naming_the_engines(wyoming_server: Wyoming) -> None:
    ask = Synthesize("x", voice=SynthesizeVoice(name="nothing")).event()
    [event] = asyncio.run(exchange(wyoming_server, ask, until="audio-stop"))
    error = Error.from_event(event)
    assert error.code == "invalid_request" and "sine" in error.text


def test_without_the_extra_the_command_names_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wyoming", None)
    assert main(["wyoming"]) == 2
    assert 'pip install "mizuoto-sdk[wyoming]"' in capsys.readouterr().err


def test_engine_chooses_the_programs_and_their_order(tmp_path: Path) -> None:
    from mizuoto_sdk.errors import EngineNotFound
    from mizuoto_sdk.server.wyoming_server import Speakers

    with RuntimeService() as service:
        chosen = Speakers(service, tmp_path, engines=["sine", "codeclm"])
        assert [p.name for p in chosen.info().tts] == ["sine", "codeclm"]
        assert chosen.request(None) == ("sine", {})  # no voice: the first engine's own
        with pytest.raises(EngineNotFound, match="known engines"):
            Speakers(service, tmp_path, engines=["nothing"])
