"""determinism.concurrent, in a real C library: the engine splits its text into words with the C
library's own ``strtok`` (through ctypes), one word per chunk.

``strtok`` keeps one hidden global pointer into the text it was last given: ``strtok(text)``
starts a text, each ``strtok(NULL)`` continues whichever text was started last. A call that
starts while another streams moves that pointer to its own text, so from then on both streams
take their words from one text, each skipping the words the other took. Serial calls, one text
at a time, are bitwise deterministic and pass every other check; declaring
``max_concurrency=1`` (manifest ``corpus-strtok-serialised``) has the host queue the calls, and
the same engine passes determinism.concurrent too.

The wrapper does what wrapping such a library takes short of queueing: one lock around each C
call (no two run at once), and the text the hidden pointer points into kept alive as long as it
may be used (the last one given, ``_STARTED``). Neither makes a sequence of calls safe.
"""

from __future__ import annotations

import ctypes
import threading

from mizuoto_broken.base import SAMPLE_RATE, BaseEngine, BaseLoaded
from mizuoto_sdk import AudioChunk

_LIBC = ctypes.CDLL(None)  # the process's own C library
_strtok = _LIBC.strtok
_strtok.restype = ctypes.c_char_p  # the word, copied into bytes before the next call moves on
_strtok.argtypes = (ctypes.c_char_p, ctypes.c_char_p)
_SEPARATORS = b" \t\n\r\f\v"
_CALL = threading.Lock()  # one C call at a time
_STARTED: list[ctypes.Array[ctypes.c_char]] = []  # the text strtok's hidden pointer is in


def _first_word(text: ctypes.Array[ctypes.c_char]) -> bytes | None:
    with _CALL:
        _STARTED[:] = [text]
        return _strtok(text, _SEPARATORS)


def _next_word() -> bytes | None:
    with _CALL:
        return _strtok(None, _SEPARATORS)  # the breakage: continues the text started last


class Loaded(BaseLoaded):
    def synthesize(self, text, params, ctx):
        self.words(text)  # an empty text is refused as the good engine refuses it
        generator = self.generator(ctx)
        # strtok writes into the text (a NUL after each word): a buffer of our own, alive
        # while this stream runs.
        buffer = ctypes.create_string_buffer(text.encode("utf-8"))
        word = _first_word(buffer)
        while word is not None:
            ctx.check_cancel()
            spoken = word.decode("utf-8")
            yield AudioChunk(self.render(spoken, generator), SAMPLE_RATE, {"word": spoken})
            word = _next_word()  # one word per chunk: two streams at once interleave here


class Engine(BaseEngine):
    LOADED = Loaded
