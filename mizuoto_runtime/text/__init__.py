"""Text for speech models, without torch: Hub tokenizers, normalisation, sentences.

- ``Tokenizer``: a tokenizer folder (tokenizer.json, tokenizer_config.json, chat template) that
  encodes and decodes as transformers' AutoTokenizer does, on the ``tokenizers`` library
- ``WhisperTokenizer``: Whisper's tiktoken vocabulary, equal to ``whisper.tokenizer``
- ``normalize``: numbers, dates, money and units spelt out for zh and en, equal to wetext
- ``split_sentences``: sentences for streaming synthesis, every character kept

Importing this package imports none of the libraries behind it: each is imported on first use,
and its absence is a ``MissingExtra`` (``engine_unavailable``) that names the extra to install.
"""

from mizuoto_runtime.text._extras import MissingExtra
from mizuoto_runtime.text.chat import ChatTemplateError
from mizuoto_runtime.text.normalize import normalize
from mizuoto_runtime.text.sentences import split_sentences
from mizuoto_runtime.text.tokenizer import Tokenizer
from mizuoto_runtime.text.whisper import WhisperTokenizer

__all__ = [
    "ChatTemplateError",
    "MissingExtra",
    "Tokenizer",
    "WhisperTokenizer",
    "normalize",
    "split_sentences",
]
