"""Conversation turns to backbone ids, as ``CsmProcessor.apply_chat_template`` makes them.

The folder's chat template renders each turn as ``<|begin_of_text|>[speaker]text<|end_of_text|>``
and, for a turn with audio, ``<|AUDIO|><|audio_eos|>`` after it. The processor then repeats each
``<|AUDIO|>`` once per codec frame of that turn's audio and tokenizes the text with
``add_special_tokens=False``; this module does the same, through ``mizuoto_runtime.text``
(the folder's tokenizer.json, its added tokens and its template). Torch-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import attrs

from mizuoto_runtime.text import Tokenizer
from mizuoto_sdk import InvalidRequest
from mizuoto_sdk.errors import EngineUnavailable

AUDIO_TOKEN = "<|AUDIO|>"
AUDIO_EOS_TOKEN = "<|audio_eos|>"
_PLACEHOLDER = "\x00audio\x00"  # never in a request's text: NUL is refused there


@attrs.frozen
class Turn:
    """One turn: who speaks (a speaker id), what they say, and the codec frames of its audio
    (None: the turn to be spoken, which is the last)."""

    speaker: int
    text: str
    frames: int | None = None


class PromptBuilder:
    """The backbone's prompt for a list of turns, from one model folder's tokenizer."""

    def __init__(self, tokenizer: Tokenizer, audio_token_id: int, audio_eos_token_id: int) -> None:
        self.tokenizer = tokenizer
        for token, wanted in ((AUDIO_TOKEN, audio_token_id), (AUDIO_EOS_TOKEN, audio_eos_token_id)):
            found = tokenizer.token_to_id(token)
            if found != wanted:
                raise EngineUnavailable(
                    f"tokenizer: {token} has id {found}, but config.json says {wanted}; the "
                    "tokenizer and the checkpoint are from different models"
                )
        self.audio_token_id = audio_token_id
        self.audio_eos_token_id = audio_eos_token_id

    @classmethod
    def from_folder(
        cls, folder: Path, audio_token_id: int, audio_eos_token_id: int
    ) -> PromptBuilder:
        try:
            tokenizer = Tokenizer.from_pretrained(folder)
        except (OSError, ValueError) as error:
            raise EngineUnavailable(f"{folder}: cannot read its tokenizer ({error})") from None
        if tokenizer.chat_template is None:
            raise EngineUnavailable(
                f"{folder}: no chat template (chat_template.jinja or tokenizer_config.json's "
                "chat_template); CSM's prompt is rendered by it"
            )
        return cls(tokenizer, audio_token_id, audio_eos_token_id)

    def ids(self, turns: Sequence[Turn]) -> list[int]:
        """The prompt's ids: each turn rendered by the template, each ``<|AUDIO|>`` repeated
        once per frame of its turn's audio."""
        messages = []
        for turn in turns:
            content: list[dict[str, object]] = [{"type": "text", "text": turn.text}]
            if turn.frames is not None:
                content.append({"type": "audio"})
            messages.append({"role": str(turn.speaker), "content": content})
        text = self.tokenizer.apply_chat_template(messages, tokenize=False)
        assert isinstance(text, str)  # tokenize=False
        frames = [turn.frames for turn in turns if turn.frames is not None]
        if text.count(AUDIO_TOKEN) != len(frames):
            raise EngineUnavailable(
                f"chat template: rendered {text.count(AUDIO_TOKEN)} {AUDIO_TOKEN} for "
                f"{len(frames)} audio turns; it is not CSM's template"
            )
        # As the processor: mark each audio token first, then expand the marks in order.
        text = text.replace(AUDIO_TOKEN, _PLACEHOLDER)
        for count in frames:
            text = text.replace(_PLACEHOLDER, AUDIO_TOKEN * count, 1)
        return self.tokenizer.encode(text, add_special_tokens=False)


def check_text(text: str, field: str) -> str:
    """``text`` unless it is empty or holds CSM's own markup, which would be read as audio (the
    processor fails on it: a count of audio tokens that matches no audio)."""
    if not text.strip():
        raise InvalidRequest(f"{field}: is empty; give the words to speak", {"field": field})
    for token in (AUDIO_TOKEN, AUDIO_EOS_TOKEN, "\x00"):
        if token in text:
            shown = repr(token) if token == "\x00" else token
            raise InvalidRequest(
                f"{field}: holds {shown}, which CSM's prompt reserves; remove it",
                {"field": field},
            )
    return text
