"""The engine under test, and the ways a check drives it: through the host, or directly.

Through the host is how the Mizuoto server runs an engine. Directly (the LoadedEngine's own
methods, in inference mode with a context bound, as the host would) shows what the engine itself
does, before the host's own guards (lazy streaming, cancel between chunks, input validation).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import secrets
import subprocess
import sys
import textwrap
import threading
from collections.abc import Generator, Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs

from mizuoto_contract.inputs import (
    DEFAULT_EXAMPLES,
    LONG_TEXTS,
    Example,
    examples,
    first_sentence,
)
from mizuoto_contract.outcome import ContractUsageError, Fail, Skip
from mizuoto_contract.watchdog import died
from mizuoto_runtime.context import RequestContext
from mizuoto_sdk import AudioChunk, EngineError, EngineManifest, InvalidRequest
from mizuoto_sdk.host import Discovery, EngineRecord, EngineRequest, LocalModel, RuntimeService

STREAMING = ("synthesize", "convert", "edit")
RELEASE_GRACE = 5.0
"""Seconds a check's hosts wait for their calls to unwind when the check ends."""
SEED = 1234
# Several sentences, so that an engine streaming a chunk per sentence has more than one chunk
# to cancel between; ``--text`` names another input.
TEXT = "Mizuoto checks every engine. It reads these words. Then it listens again."


def sample_audio(seconds: float = 0.5, sample_rate: int = 16_000) -> AudioChunk:
    """A deterministic input for convert and edit: a 220 Hz tone."""
    import numpy as np

    t = np.arange(round(seconds * sample_rate), dtype=np.float32) / sample_rate
    return AudioChunk((0.3 * np.sin(2 * np.pi * 220 * t)).astype(np.float32), sample_rate)


class NotLoadable(Skip):
    """The model does not load, so a check that needs it cannot run; ``error`` says why.

    One cause is reported once, by load.device (or discovery.class_matches_manifest when the
    Engine class is at fault), instead of as a crash in every check that loads.
    """

    def __init__(self, message: str, error: EngineError) -> None:
        super().__init__(message)
        self.error = error


@attrs.define
class Subject:
    """One engine on one device, with fresh hosts on demand.

    ``shared`` holds what several checks read from one piece of work (the isolated run in a fresh
    process), so that it runs once per engine.
    """

    engine_id: str
    device: str
    record: EngineRecord
    discovery: Discovery
    text: str = TEXT
    examples: int = DEFAULT_EXAMPLES
    shared: dict[str, Any] = attrs.field(factory=dict, repr=False)
    # The streaming capability being checked, when the engine declares several (``checking``).
    _checking: str | None = attrs.field(default=None, init=False, repr=False)
    # The hosts this subject made, closed after each check (``release``).
    _services: list[RuntimeService] = attrs.field(factory=list, init=False, repr=False)
    _services_lock: threading.Lock = attrs.field(factory=threading.Lock, init=False, repr=False)

    @property
    def manifest(self) -> EngineManifest:
        assert self.record.manifest is not None
        return self.record.manifest

    @property
    def capability(self) -> str | None:
        """The streaming capability the checks exercise now (``checking``; by default the first
        declared, synthesize first), or None."""
        return self._checking or next(iter(self.capabilities), None)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """Every streaming capability the engine declares, synthesize first."""
        return tuple(c for c in STREAMING if c in self.manifest.capabilities)

    @contextlib.contextmanager
    def checking(self, capability: str | None) -> Iterator[None]:
        """Exercise ``capability`` (one the engine declares; None: the default one) until the
        block ends."""
        saved, self._checking = self._checking, capability
        try:
            yield
        finally:
            self._checking = saved

    def long_text(self, handle: LocalModel) -> str:
        """What the checks that stop a stream speak: the longest of ``LONG_TEXTS`` the engine
        takes (the sample text if it refuses them all with InvalidRequest), found once per
        subject by starting a stream of each and closing it at its first chunk."""
        key = f"long_text:{self.capability}"
        if key not in self.shared:
            found = self.text
            if self.capability in ("synthesize", "edit"):
                for text in LONG_TEXTS:
                    stream = self.stream(handle, EngineRequest(params={"seed": SEED}), text)
                    try:
                        next(stream, None)
                    except InvalidRequest:
                        continue
                    finally:
                        with contextlib.suppress(EngineError):
                            stream.close()
                    found = text
                    break
            self.shared[key] = found
        return self.shared[key]

    @property
    def first_pass(self) -> bool:
        """Whether the checked capability is the first (or only) one: what is checked once per
        engine, not per capability, is checked then."""
        return self.capability in (None, *self.capabilities[:1])

    @property
    def sentence(self) -> str:
        """The sample text's first sentence: what most comparing checks speak (a call costs
        what its text is long)."""
        return first_sentence(self.text)

    def cases(self) -> list[Example]:
        """The explored examples: ``examples`` seeds, short texts taking turns."""
        return examples(self.text, self.examples, SEED)

    def service(self, settings: Mapping[str, object] | None = None) -> RuntimeService:
        """A new host, which ``release`` closes."""
        service = RuntimeService(settings, discovery=self.discovery)
        with self._services_lock:
            self._services.append(service)
        return service

    def release(self, grace: float = RELEASE_GRACE) -> None:
        """Close every host made since the last release: their calls are stopped and their
        models unloaded, as a server's are, so that what an engine frees at unload is freed
        between checks. An engine whose unload fails is resources.unload_releases' to report."""
        with self._services_lock:
            services, self._services = self._services, []
        for service in services:
            with contextlib.suppress(Exception):
                service.close(grace=grace)

    def load(self, service: RuntimeService | None = None) -> LocalModel:
        """A freshly loaded model (a new host each time unless ``service`` is given).

        Raises NotLoadable (a Skip) when loading fails with an EngineError.
        """
        try:
            return (service or self.service()).engine(self.engine_id, self.device).load()
        except EngineError as error:
            culprit = "load.device" if self._class_usable() else "discovery.class_matches_manifest"
            raise NotLoadable(
                f"not run: {self.engine_id} does not load on {self.device} (see {culprit}): "
                f"[{error.code}] {error}",
                error,
            ) from error

    def _class_usable(self) -> bool:
        try:
            self.discovery.get_engine(self.engine_id)
        except EngineError:
            return False
        return True

    def arguments(self, text: str | None = None) -> tuple[Any, ...]:
        """The inputs of ``capability``, before params."""
        text = self.text if text is None else text
        return {
            "synthesize": (text,),
            "convert": (sample_audio(),),
            "edit": (sample_audio(), text),
        }[self.capability or "synthesize"]

    def stream(
        self, handle: LocalModel, request: EngineRequest | None = None, text: str | None = None
    ) -> Generator[AudioChunk, None, None]:
        """The host's stream of the checked capability (``text``: another input than the sample
        text), every chunk checked as it passes (``checked``)."""
        method = getattr(handle, self.capability or "synthesize")
        said = "" if text is None or text == self.text else f" for {_quote(text)}"
        return checked(method(*self.arguments(text), request), said)

    def audio(self, handle: LocalModel, seed: int, text: str | None = None) -> bytes:
        """All of a seeded stream's samples, as bytes, through the host."""
        return join(list(self.stream(handle, EngineRequest(params={"seed": seed}), text)))

    def speak(self, handle: LocalModel, example: Example) -> bytes | None:
        """``audio`` for an explored example; None when the engine refuses its text with
        InvalidRequest (an engine may refuse symbols or letters it cannot read, never its
        sample text)."""
        try:
            return self.audio(handle, example.seed, example.text)
        except InvalidRequest:
            if example.text in self.text:
                raise
            return None

    def close_early(self, handle: LocalModel, text: str | None = None) -> EngineError | None:
        """Take one chunk of a seeded stream of ``text`` (default: the long text), then close it;
        the error closing raised, if any.

        A failing close is stream.early_close's to report; the other checks that abort streams
        carry on past it.
        """
        text = self.long_text(handle) if text is None else text
        stream = self.stream(handle, EngineRequest(params={"seed": SEED}), text)
        next(stream)
        try:
            stream.close()
        except EngineError as error:
            return error
        return None

    def context(self, seed: int) -> RequestContext:
        """A context as the host makes one for a seeded request: the seed, and the params with
        the seed among them."""
        return RequestContext(seed=seed, params=self.params({"seed": seed}))

    def engine_audio(
        self,
        handle: LocalModel,
        text: str,
        seed: int,
        may_refuse: bool = False,
        *,
        named: bool = True,
    ) -> bytes | None:
        """The samples of the engine's own stream of ``text`` with ``seed``, every chunk checked;
        None when the engine refused the text (allowed by ``may_refuse``) with InvalidRequest.
        A failure names the text and seed unless ``named`` is false (an explored example's
        report names them itself)."""
        import numpy as np

        from mizuoto_contract.trace import generator_frame

        ctx = self.context(seed)
        said = "" if text == self.text or not named else f" for {_quote(text)}, seed {seed}"
        try:
            iterator = iter(self.engine_stream(handle, ctx, text=text))  # type: ignore[call-overload]  # the engine's stream
        except InvalidRequest:
            if may_refuse:
                return None
            raise
        roots = self.sources()
        rates: list[int] = []
        samples: list[np.ndarray] = []
        count = 0
        while True:
            try:
                with self.direct(ctx):
                    chunk = next(iterator, None)
            except InvalidRequest:
                if may_refuse and count == 0:
                    return None
                raise
            if chunk is None:
                break
            count += 1
            problem = chunk_problem(chunk, rates[0] if rates else None)
            if problem is not None:
                where = generator_frame(iterator, roots)  # the engine's yield of this chunk
                raise Fail(problem[0], f"chunk {count - 1}{said}: {problem[1]}", where)
            rates.append(chunk.sample_rate)
            values = chunk.samples
            values = values.detach().float().cpu().numpy() if hasattr(values, "detach") else values
            samples.append(np.asarray(values, dtype=np.float32).reshape(-1))
        if count == 0:
            raise Fail("at least one chunk", f"an empty stream{said}")
        return np.concatenate(samples).tobytes()

    @contextlib.contextmanager
    def direct(self, ctx: RequestContext) -> Iterator[None]:
        """Run engine code as the host would: inference mode (for an engine that uses torch),
        context bound."""
        if not self.manifest.uses_torch:
            with ctx.bind():
                yield
            return
        import torch

        with torch.inference_mode(), ctx.bind():
            yield

    def engine_stream(
        self,
        handle: LocalModel,
        ctx: RequestContext,
        params: Mapping[str, object] | None = None,
        *,
        text: str | None = None,
    ) -> object:
        """What the engine's own method returns (no host in between); ``text``: another input
        than the sample text."""
        method = getattr(handle.loaded_engine, self.capability or "synthesize")
        params = self.params(ctx.params if params is None else params)
        with self.direct(ctx):
            return method(*self.arguments(text), params, ctx)

    def params(self, params: Mapping[str, object] | None = None) -> dict[str, object]:
        """``params`` as the host hands them to the engine: checked against the manifest's
        declared params, defaults filled in."""
        return dict(self.manifest.check_params(dict(params or {})))

    def sources(self) -> list[Path]:
        """The folders (or files) of the engine's top-level packages: its implementation and its
        plugin module. A frame in them is the engine's own code."""
        modules = [self.manifest.implementation.partition(":")[0]]
        _, _, value = self.record.entry_point.partition(" = ")
        if value.partition(":")[0].replace(".", "").isidentifier():
            modules.append(value.partition(":")[0])
        roots: list[Path] = []
        for module in modules:
            try:
                spec = importlib.util.find_spec(module.split(".")[0])
            except (ImportError, ValueError):
                spec = None
            if spec is None:
                continue
            if spec.submodule_search_locations:
                roots.extend(Path(p).resolve() for p in spec.submodule_search_locations)
            elif spec.origin:
                roots.append(Path(spec.origin).resolve())
        return sorted(set(roots))

    def where(self, error: BaseException) -> str | None:
        """``file:line in function`` of the innermost frame of the engine's own code that
        ``error`` (or an exception it was raised from) passed through; None when none did."""
        from mizuoto_contract.trace import engine_frame

        return engine_frame(error, self.sources())

    def in_child(
        self,
        arguments: list[str],
        environment: Mapping[str, str] | None = None,
        output: Path | None = None,
        *,
        base: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> subprocess.Popen[str]:
        """Start a fresh interpreter that sees the same plugins, with a hash seed of its own.

        Python salts ``hash()`` per process unless PYTHONHASHSEED fixes it; CI runners often do,
        and a child inheriting the parent's value would hide hash-dependent output. With
        ``output`` (a folder), stdout and stderr go to files there instead of pipes, so that a
        program the engine started and left running cannot hold the answer back. ``base`` is the
        environment to start from (default: this one), ``cwd`` the folder (default: this one).
        """
        env = child_environment(environment, base)
        if output is None:
            streams: dict[str, Any] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
        else:
            streams = {
                "stdout": open(output / "stdout", "w"),  # noqa: SIM115 - closed by child_result
                "stderr": open(output / "stderr", "w"),  # noqa: SIM115
            }
        child = subprocess.Popen(
            [sys.executable, *arguments],
            stdin=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=cwd,
            **streams,
        )
        child.output = output  # type: ignore[attr-defined]  # the suite's note on the Popen
        for stream in streams.values():
            if hasattr(stream, "close"):
                stream.close()
        return child

    def run_child(self, body: str, expected: str, timeout: float = 600) -> Any:
        """Run ``body`` in a fresh interpreter; the JSON value its last line prints. A failing
        child is a Fail saying ``expected`` and its last error line."""
        script = "import json, sys, time\n" + textwrap.dedent(body)
        child = self.in_child(["-c", script])
        return child_result(child, expected, timeout)


def child_environment(
    extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """``base`` (default: this environment) for a child that sees the same plugins, with a
    hash seed of its own."""
    base = os.environ if base is None else base
    env = {**base, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(extra or {})}
    env["PYTHONHASHSEED"] = str(_other_hash_seed(os.environ.get("PYTHONHASHSEED")))
    return env


def child_result(child: subprocess.Popen[str], expected: str, timeout: float) -> Any:
    """The JSON value of the child's last output line; a Fail when it failed or timed out."""
    output: Path | None = getattr(child, "output", None)
    try:
        if output is None:
            out, err = child.communicate(timeout=timeout)
        else:
            child.wait(timeout=timeout)
            out = (output / "stdout").read_text()
            err = (output / "stderr").read_text()
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        raise Fail(expected, f"no answer within {timeout:.0f} s") from None
    if child.returncode is not None and child.returncode < 0:  # a crash: name it, show where
        raise Fail(expected, died(child.returncode, err))
    if child.returncode != 0:
        last = err.strip().splitlines()[-1:] or ["no output"]
        raise Fail(expected, f"exit {child.returncode}: {last[0]}")
    return json.loads(out.strip().splitlines()[-1])


def _other_hash_seed(parent: str | None) -> int:
    while True:
        seed = secrets.randbelow(2**32 - 1) + 1
        if str(seed) != parent:
            return seed


def _quote(text: str) -> str:
    return repr(text) if len(text) <= 32 else repr(text[:29]) + "..."


def chunk_problem(chunk: object, rate: int | None) -> tuple[str, str] | None:
    """What is wrong with one chunk of a stream, as (rule, observed); None when nothing is:
    an AudioChunk of finite samples, not empty, at the stream's rate (``rate``: the earlier
    chunks', None for the first)."""
    import numpy as np

    if not isinstance(chunk, AudioChunk):
        kind = f"{type(chunk).__module__}.{type(chunk).__qualname__}"
        return "every chunk a mizuoto_sdk.AudioChunk", kind
    samples = chunk.samples
    samples = samples.detach().float().cpu().numpy() if hasattr(samples, "detach") else samples
    if samples.shape[-1] == 0:
        return "non-empty chunks", "a chunk without samples"
    if not np.isfinite(samples).all():
        return "finite samples", "NaN or inf in a chunk"
    if rate is not None and chunk.sample_rate != rate:
        return "one sample rate per stream", f"a chunk at {chunk.sample_rate} Hz after {rate} Hz"
    return None


def checked(stream: Iterator[AudioChunk], said: str = "") -> Generator[AudioChunk, None, None]:
    """``stream``, each chunk checked by ``chunk_problem`` as it passes (a Fail naming the chunk);
    closing this closes ``stream``, and what its close raises comes through."""
    rate: int | None = None
    try:
        for index, chunk in enumerate(stream):
            problem = chunk_problem(chunk, rate)
            if problem is not None:
                raise Fail(problem[0], f"chunk {index}{said}: {problem[1]}")
            rate = chunk.sample_rate
            yield chunk
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()


def join(chunks: list[AudioChunk]) -> bytes:
    """The samples of host chunks (float32 mono), concatenated, as bytes."""
    import numpy as np

    return np.concatenate([c.samples for c in chunks]).tobytes() if chunks else b""


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def differ(first: bytes, second: bytes) -> str:
    """Where two float32 sample buffers part: their lengths, or the first sample that differs."""
    if len(first) != len(second):
        return f"{len(first) // 4} samples, then {len(second) // 4}"
    index = next(i for i in range(0, len(first), 4) if first[i : i + 4] != second[i : i + 4])
    return f"equal length, first difference at sample {index // 4}"


def subject_for(
    engine_id: str,
    device: str = "cpu",
    discovery: Discovery | None = None,
    text: str | None = None,
    examples: int = DEFAULT_EXAMPLES,
) -> Subject:
    """The engine ``engine_id`` as the checks see it; an unknown engine is a usage error."""
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 1:
        raise ContractUsageError(f"examples: expected a whole number >= 1, got {examples!r}")
    discovery = discovery or Discovery()
    record = next(
        (r for r in discovery.records() if r.id == engine_id and r.manifest is not None), None
    )
    if record is None:
        raise ContractUsageError(f"no engine {engine_id!r}")
    subject = Subject(engine_id, device, record, discovery, examples=examples)
    # --text wins over the manifest's sample_text, which wins over the suite's own sentences.
    text = subject.manifest.sample_text if text is None else text
    if text is not None:
        if not isinstance(text, str) or not text.strip():
            raise ContractUsageError(f"text: expected some words to speak, got {text!r}")
        subject.text = text
    return subject
