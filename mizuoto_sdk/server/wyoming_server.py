"""Every synthesizing engine over the Wyoming protocol (Home Assistant's voice pipeline), on the
``wyoming`` package, which does the framing: ``mizuoto wyoming`` runs it.

``describe`` answers ``info`` with one TTS program per engine, whose voices are ``ENGINE`` (its
own voice) and ``ENGINE:VOICE`` (``openai_voices``). ``synthesize`` answers ``audio-start``, an
``audio-chunk`` of 16-bit mono PCM at the engine's rate as each chunk comes, and ``audio-stop``.
The streaming events feed text in. An engine that declares ``text_input=True`` gets one call,
started with the first chunk that has a word, whose ``EngineRequest.text_input`` carries the
later chunks' text (one audio-start ... audio-stop for it all). Other engines read their text
whole, so the text of ``synthesize-chunk`` events is cut into sentences as it comes
(``split_sentences``) and each finished sentence is spoken (its own audio-start ... audio-stop,
as wyoming-piper does) while the rest arrives. ``synthesize-stop`` ends the text, speaks what
is left and answers ``synthesize-stopped``. The
``synthesize`` that Home Assistant sends inside a streamed request, the same text again, is not
spoken twice. A failure is an ``error`` event with the registry's code.

Each connection's engine calls run one at a time on a thread of its own, one chunk per step, so
a client that reads slowly holds its engine back. A client that disconnects cancels its call:
the engine stops at its next cancel check. A stop (SIGINT, SIGTERM) closes the listener and every
connection, which cancels their calls, and waits for them up to ``host.stop_timeout``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import signal
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeStopped,
    SynthesizeVoice,
)

from mizuoto_runtime.text import split_sentences
from mizuoto_sdk.audio import pcm16
from mizuoto_sdk.errors import EngineError, InvalidRequest
from mizuoto_sdk.host import EngineRequest, RuntimeService
from mizuoto_sdk.manifest import EngineManifest
from mizuoto_sdk.server.openai_voices import voice_param, voices

log = logging.getLogger(__name__)

ATTRIBUTION = Attribution(name="Mizuoto", url="https://pypi.org/project/mizuoto-sdk/")
_T = TypeVar("_T")


class Speakers:
    """The engines a Wyoming server speaks with, and what each request of theirs sends."""

    def __init__(
        self,
        service: RuntimeService,
        voices_folder: Path,
        params: Mapping[str, Mapping[str, Any]] | None = None,
        *,
        engines: Sequence[str] | None = None,
    ) -> None:
        """``params``: engine id -> the params every request to it carries (``--param``);
        ``engines``: the engines served, in this order (None: every one that synthesizes, by
        id); one that does not synthesize is an InvalidRequest naming it."""
        self.service = service
        self.voices_folder = voices_folder
        self.params = dict(params or {})
        records = service.discovery.records()
        speaking = {
            r.id: r.manifest
            for r in records
            if r.ok and r.manifest is not None and "synthesize" in r.manifest.capabilities
        }
        for engine in engines or ():
            if service.discovery.manifest(engine).id not in speaking:  # unknown: not found
                raise InvalidRequest(
                    f"--engine {engine}: it does not synthesize", {"field": "engine"}
                )
        chosen = list(engines) if engines else list(speaking)
        self.engines: dict[str, EngineManifest] = {e: speaking[e] for e in chosen}
        self.versions = {r.id: r.version for r in records}

    def info(self) -> Info:
        programs = []
        for engine, manifest in self.engines.items():
            named = [engine, *(f"{engine}:{v}" for v in voices(manifest, self.voices_folder))]
            described = manifest.description or manifest.name
            programs.append(
                TtsProgram(
                    name=engine,
                    attribution=ATTRIBUTION,
                    installed=True,
                    description=described,
                    version=self.versions.get(engine),
                    voices=[
                        TtsVoice(
                            name=name,
                            attribution=ATTRIBUTION,
                            installed=True,
                            description=name,
                            version=self.versions.get(engine),
                            languages=[],
                        )
                        for name in named
                        if name != f"{engine}:default"
                    ],
                    supports_synthesize_streaming=True,
                )
            )
        return Info(tts=programs)

    def request(self, voice: SynthesizeVoice | None) -> tuple[str, dict[str, Any]]:
        """The engine and params of a request for ``voice`` (None or no name: the first
        engine's own voice)."""
        name = voice.name if voice is not None and voice.name else next(iter(self.engines), "")
        engine, _, chosen = name.partition(":")
        manifest = self.engines.get(engine)
        if manifest is None:
            raise InvalidRequest(
                f"voice: no engine {engine!r} here; voices are ENGINE or ENGINE:VOICE, engines: "
                f"{', '.join(self.engines) or 'none'}",
                {"field": "voice"},
            )
        params = dict(self.params.get(engine, {}))
        if chosen:
            value = voice_param(manifest, self.voices_folder, chosen, "voice")
            if value is not None:
                params["voice"] = value
        return engine, params


class SpeechHandler(AsyncEventHandler):
    """One client's connection: its events in order, its engine calls one at a time."""

    def __init__(
        self, speakers: Speakers, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        super().__init__(reader, writer)
        self.speakers = speakers
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="wyoming-call")
        self._work: asyncio.Task[None] | None = None  # the last of the queued jobs
        self._call: EngineRequest | None = None  # the call that runs now
        self._gone = False
        self._streamed: SynthesizeVoice | bool | None = False  # False: no streamed request open
        self._text = ""
        # A streamed request to an engine that reads text_input: None until its call starts.
        self._reads_input = False
        self._feed: queue.Queue[str | None] | None = None

    async def handle_event(self, event: Event) -> bool:
        if Describe.is_type(event.type):
            await self.write_event(self.speakers.info().event())
        elif Ping.is_type(event.type):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        elif SynthesizeStart.is_type(event.type):
            self._streamed, self._text = SynthesizeStart.from_event(event).voice, ""
            self._reads_input, self._feed = self._text_input(self._streamed), None
        elif SynthesizeChunk.is_type(event.type) and self._streamed is not False:
            self._text += SynthesizeChunk.from_event(event).text
            if self._feed is not None:
                self._feed.put(self._text)
                self._text = ""
            elif self._reads_input and self._text.strip():
                self._feed = queue.Queue()  # the call starts with the text so far
                self._queue(self._speak, self._text, self._streamed, self._feed)
                self._text = ""
            elif not self._reads_input:
                *finished, self._text = split_sentences(self._text) or [""]
                for sentence in finished:
                    self._queue(self._speak, sentence, self._streamed)
        elif SynthesizeStop.is_type(event.type) and self._streamed is not False:
            if self._feed is not None:
                self._feed.put(None)  # the text has ended: the call speaks what is left
            else:
                self._queue(self._speak, self._text, self._streamed)
            self._queue(self._stopped)
            self._streamed, self._text, self._feed = False, "", None
        elif Synthesize.is_type(event.type) and self._streamed is False:
            asked = Synthesize.from_event(event)
            self._queue(self._speak, asked.text, asked.voice)
        return True

    def _queue(self, job: Callable[..., Awaitable[None]], *args: Any) -> None:
        """Run ``job`` after the jobs queued before it (a client's audio comes in its order)."""
        previous = self._work

        async def after() -> None:
            if previous is not None:
                await asyncio.wait({previous})
            if self._gone:
                return
            try:
                await job(*args)
            except Exception:  # no handler expected it: the client is told, the log has it
                log.exception("a Wyoming request failed")
                if not self._gone:
                    await self.write_event(
                        Error(text="the server failed", code="engine_error").event()
                    )

        self._work = asyncio.create_task(after())

    def _text_input(self, voice: SynthesizeVoice | None) -> bool:
        """Whether the engine of ``voice`` reads text streamed in (an unknown voice: no, and
        the request's failure names it when it is spoken)."""
        try:
            engine, _ = self.speakers.request(voice)
        except InvalidRequest:
            return False
        return self.speakers.engines[engine].text_input

    async def _stopped(self) -> None:
        await self.write_event(SynthesizeStopped().event())

    async def _step(self, function: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._thread, function, *args)

    async def _speak(
        self,
        text: str,
        voice: SynthesizeVoice | None,
        text_input: queue.Queue[str | None] | None = None,
    ) -> None:
        """Speak ``text``, then what ``text_input`` (if any) carries until its end."""
        if not text.strip():
            return
        stream: Iterator[Any] | None = None
        try:
            engine, params = self.speakers.request(voice)
            self._call = call = EngineRequest(params=params, text_input=text_input)
            model = await self._step(self.speakers.service.load, engine)
            stream = iter(model.synthesize(text, call))
            sent = 0  # samples, for the timestamps
            rate = 0
            while (chunk := await self._step(next, stream, None)) is not None:
                if rate == 0:
                    rate = chunk.sample_rate
                    await self.write_event(AudioStart(rate, 2, 1, timestamp=0).event())
                audio = pcm16(chunk.samples)
                stamp = sent * 1000 // rate
                await self.write_event(AudioChunk(rate, 2, 1, audio, timestamp=stamp).event())
                sent += len(chunk.samples)
            if rate == 0:
                raise InvalidRequest(
                    f"text: engine {engine!r} made no audio of it", {"field": "text"}
                )
            await self.write_event(AudioStop(timestamp=sent * 1000 // rate).event())
        except EngineError as error:
            if not self._gone:
                log.warning("synthesis failed [%s]: %s", error.code, error.message)
                await self.write_event(Error(text=error.message, code=error.code).event())
        except (ConnectionError, OSError):  # the client is gone: its call is cancelled below
            self._leave()
        finally:
            if stream is not None:
                close = getattr(stream, "close", None)
                if close is not None:
                    await self._step(close)
            self._call = None

    def _leave(self) -> None:
        self._gone = True
        if self._call is not None:
            self._call.cancel()

    async def disconnect(self) -> None:
        """The client left, or the server stops: cancel the call that runs and wait for it."""
        self._leave()
        if self._work is not None:
            grace = float(self.speakers.service.settings.get("host.stop_timeout"))
            done, _ = await asyncio.wait({self._work}, timeout=grace)
            if not done:
                log.warning("a call had not ended %.1f s after its client left", grace)
        self._thread.shutdown(wait=False)


async def serve(
    speakers: Speakers, uri: str, announce: Callable[[str], None], stop: asyncio.Event
) -> None:
    """Serve ``speakers`` on ``uri`` (``tcp://HOST:PORT``, port 0 a free one, or
    ``unix://PATH``) until ``stop`` is set; ``announce`` is told where it listens."""
    handlers: set[SpeechHandler] = set()
    tasks: set[asyncio.Task[Any]] = set()

    async def connected(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = SpeechHandler(speakers, reader, writer)
        handlers.add(handler)
        task = asyncio.current_task()
        if task is not None:
            tasks.add(task)
        try:
            await handler.run()
        except (ConnectionError, OSError) as error:
            log.info("a client's connection ended: %s", error)
        finally:
            handlers.discard(handler)

    parts = urlsplit(uri)
    if parts.scheme == "tcp" and parts.hostname is not None and parts.port is not None:
        server = await asyncio.start_server(connected, parts.hostname, parts.port)
        host, port = server.sockets[0].getsockname()[:2]
        where = f"tcp://{f'[{host}]' if ':' in host else host}:{port}"
    elif parts.scheme == "unix" and parts.path:
        server = await asyncio.start_unix_server(connected, parts.path)
        where = uri
    else:
        raise ValueError(f"{uri!r}: expected tcp://HOST:PORT or unix://PATH")
    async with server:
        announce(where)
        await stop.wait()
        server.close()
        for handler in list(handlers):
            await handler.stop()
        if tasks:
            await asyncio.wait(tasks)


def run(speakers: Speakers, uri: str, announce: Callable[[str], None]) -> None:
    """``serve`` until SIGINT or SIGTERM, then close the service (its calls have unwound)."""

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await serve(speakers, uri, announce, stop)
        finally:
            for signum in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signum)

    try:
        asyncio.run(main())
    finally:
        speakers.service.close()
