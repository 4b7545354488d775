"""text.Tokenizer against transformers' AutoTokenizer, on byte-level BPE tokenizers trained here.

Two families, saved as transformers saves them (``PreTrainedTokenizerFast.save_pretrained``):
Qwen2-style (NFC, a Split regex then ByteLevel, ChatML tokens) and Llama-3-style (no normaliser,
a post-processor that puts ``<|begin_of_text|>`` first). Each folder is then edited the ways Hub
folders differ: flags in ``added_tokens_decoder``, tokens only tokenizer_config.json lists,
``split_special_tokens``, ``add_bos_token``, ``clean_up_tokenization_spaces``, legacy files.
"""

# ruff: noqa: RUF001  (full-width and CJK punctuation is what this file is about)

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mizuoto_runtime.text import ChatTemplateError, Tokenizer

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA_CHAT = (
    "{{ bos_token }}{% for message in messages %}"
    "<|start_header_id|>{{ message['role'] }}<|end_header_id|>\n\n"
    "{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 3:45pm, isn't it? We'll see.",
    "Café, naïve, résumé, Ångström, façade: accents everywhere.",
    "東京は日本の首都です。今日はいい天気ですね！北京欢迎你，上海也欢迎你。",
    "안녕하세요 세계. Привет, мир! Γειά σου κόσμε. مرحبا بالعالم",
    "Emoji 😀🎉👍🏽 and flags 🇯🇵🇫🇷, numbers 1234567890, symbols @#$%^&*()[]{}",
    "def main():\n    return 42\n\n\tindented\r\nwindows line\n",
] * 20
TEXTS = [
    "",
    " ",
    "Hello world",
    "  leading and trailing  ",
    "tabs\tand\nnewlines\r\n\n\n  runs     of    spaces",
    "Cafe\u0301 and cafe\u0301 and Cafe\u0301",  # decomposed: NFC composes them (Qwen2 style)
    "Ångström Å A\u030a",
    "東京は日本の首都です。北京欢迎你！",
    "😀🎉👍🏽🇯🇵 mixed with text",
    "<|im_start|>user\nhi<|im_end|>",
    "text<|endoftext|>more<|im_end|><|im_start|>",
    "<|begin_of_text|>Llama tokens<|eot_id|> and <|start_header_id|>",
    "almost special <|im_start| and <|im_end|>> and <<|endoftext|>>",
    "spaces before <|im_end|>   and after <|im_end|>   ",
    "it's I'LL we've THEY'RE",
    "1234567890 3.14159 1,000,000",
    "\x00\x01\x7f control \u200b zero width \ufeff bom",
    "<extra_one> and <extra_two> and <pad>",
]


def _train(kind: str) -> tokenizers.Tokenizer:
    from tokenizers import (
        Regex,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    backend = tokenizers.Tokenizer(models.BPE())
    pattern = QWEN_PATTERN if kind == "qwen2" else LLAMA_PATTERN
    if kind == "qwen2":
        backend.normalizer = normalizers.NFC()
        specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    else:
        specials = [
            "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>",
        ]  # fmt: skip
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=900,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(CORPUS, trainer)
    if kind == "qwen2":
        backend.post_processor = processors.ByteLevel(trim_offsets=False)
    else:
        bos = backend.token_to_id("<|begin_of_text|>")
        backend.post_processor = processors.TemplateProcessing(
            single="<|begin_of_text|> $A",
            pair="<|begin_of_text|> $A <|begin_of_text|> $B:1",
            special_tokens=[("<|begin_of_text|>", bos)],
        )
    return backend


def save(kind: str, folder: Path, **config_edits: object) -> Path:
    """A trained tokenizer saved by transformers into ``folder``, then tokenizer_config.json
    edited (a None value removes the key)."""
    if kind == "qwen2":
        tokens = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}
        template = CHATML
    else:
        tokens = {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}
        template = LLAMA_CHAT
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=_trained(kind), chat_template=template, **tokens
    )
    fast.save_pretrained(folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key, value in config_edits.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    config_path.write_text(json.dumps(config))
    return folder


_TRAINED: dict[str, str] = {}


def _trained(kind: str) -> tokenizers.Tokenizer:
    """Training takes a moment: once per kind, copied for each folder."""
    if kind not in _TRAINED:
        _TRAINED[kind] = _train(kind).to_str()
    return tokenizers.Tokenizer.from_str(_TRAINED[kind])


def added(content: str, **flags: bool) -> dict[str, object]:
    base = {"lstrip": False, "rstrip": False, "single_word": False, "normalized": False}
    return {"content": content, **base, "special": True, **flags}


VARIANTS = {
    "qwen2": ("qwen2", {}),
    "llama3": ("llama3", {}),
    # the config's flags win over tokenizer.json's: strip spaces around <|im_end|>
    "qwen2-flags": (
        "qwen2",
        {
            "added_tokens_decoder": {
                "0": added("<|endoftext|>"),
                "1": added("<|im_start|>", rstrip=True),
                "2": added("<|im_end|>", lstrip=True, rstrip=True),
                "900": added("<extra_one>", special=False, normalized=True),
                "901": added("<extra_two>", single_word=True),
            }
        },
    ),
    # tokens only the config lists: named, extra and model-specific ones get new ids
    "qwen2-config-tokens": (
        "qwen2",
        {
            "unk_token": "<unk>",
            "extra_special_tokens": ["<extra_one>", "<|im_start|>"],
            "audio_token": "<extra_two>",
        },
    ),
    # Hub folders name their class: transformers rebuilds Qwen2's pipeline from vocab and merges
    "qwen2-class": ("qwen2", {"tokenizer_class": "Qwen2Tokenizer"}),
    "llama3-class": ("llama3", {"tokenizer_class": "PreTrainedTokenizerFast"}),
    "qwen2-split-special": ("qwen2", {"split_special_tokens": True}),
    # transformers 5 drops add_bos_token/add_eos_token when tokenizer.json exists
    "llama3-add-eos": ("llama3", {"add_bos_token": False, "add_eos_token": True}),
    "llama3-legacy-additional": (
        "llama3",
        {
            "additional_special_tokens": ["<pad>"],
            "bos_token": {"__type": "AddedToken", **added("<|begin_of_text|>", special=False)},
        },
    ),
    "qwen2-clean-up": ("qwen2", {"clean_up_tokenization_spaces": True}),
    "qwen2-clean-up-forced": (
        "qwen2",
        {
            "clean_up_tokenization_spaces": True,
            "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output": True,
        },
    ),
}


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def pair(request, tmp_path_factory) -> tuple[Tokenizer, object]:
    kind, edits = VARIANTS[request.param]
    folder = save(kind, tmp_path_factory.mktemp(request.param), **edits)
    return Tokenizer.from_pretrained(folder), transformers.AutoTokenizer.from_pretrained(folder)


def test_encode_and_decode_equal_transformers(pair):
    ours, theirs = pair
    assert len(ours) == len(theirs)
    for text in TEXTS + CORPUS[:6]:
        for special in (False, True):
            ids = theirs.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (False, True):
                assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
                    ids, skip_special_tokens=skip
                ), (text, skip)
    assert ours.encode_batch(TEXTS) == [theirs.encode(t, add_special_tokens=False) for t in TEXTS]


def test_decoding_ids_the_text_never_gives_equals_transformers(pair):
    ours, theirs = pair
    ids = [*list(range(len(theirs))), 5, 5, 0, 1, 2]
    for skip in (False, True):
        assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(
            ids, skip_special_tokens=skip
        )


_text = st.lists(
    st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
    | st.sampled_from(["<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "\u0301", "  ", "\n"]),
    max_size=8,
).map("".join)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(text=_text)
def test_any_text_encodes_as_transformers_does(pair, text):
    ours, theirs = pair
    ids = theirs.encode(text, add_special_tokens=False)
    assert ours.encode(text) == ids
    assert ours.decode(ids) == theirs.decode(ids)


def test_nfc_is_applied_by_a_qwen2_tokenizer(tmp_path):
    ours = Tokenizer.from_pretrained(save("qwen2", tmp_path))
    decomposed = "Cafe\u0301 re\u0301sume\u0301"
    assert ours.encode(decomposed) == ours.encode(unicodedata.normalize("NFC", decomposed))


def test_llama3_puts_its_bos_first_only_when_asked(tmp_path):
    ours = Tokenizer.from_pretrained(save("llama3", tmp_path))
    bos = ours.token_to_id("<|begin_of_text|>")
    assert ours.encode("Hi", add_special_tokens=True) == [bos, *ours.encode("Hi")]
    assert ours.special_tokens["bos_token"] == "<|begin_of_text|>"


MESSAGES = [
    {"role": "system", "content": "You speak briefly."},
    {"role": "user", "content": "Hello <|im_end|> there, café 東京 😀"},
    {"role": "assistant", "content": "  Hi!  ", "reasoning_content": "greet"},
    {"role": "user", "content": "Say it again."},
]


@pytest.mark.parametrize("kind", ["qwen2", "llama3"])
@pytest.mark.parametrize("where", ["jinja", "config"])
def test_chat_template_equals_transformers(tmp_path, kind, where):
    folder = save(kind, tmp_path)
    if where == "config":  # the older place: an entry in tokenizer_config.json
        template = (folder / "chat_template.jinja").read_text()
        (folder / "chat_template.jinja").unlink()
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(
            json.dumps({**config, "chat_template": template})
        )
    ours = Tokenizer.from_pretrained(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    for prompt in (False, True):
        text = theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt)
        assert (
            ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=prompt) == text
        )
        ids = theirs.apply_chat_template(MESSAGES, add_generation_prompt=prompt, return_dict=False)
        assert ours.apply_chat_template(MESSAGES, add_generation_prompt=prompt) == ids


def test_chat_template_sandbox_filters_and_variables_equal_transformers(tmp_path):
    template = (
        "{%- set ns = namespace(n=0) -%}{%- for m in messages -%}{%- set ns.n = ns.n + 1 -%}"
        "{%- if m.role == 'assistant' %}{% generation %}{{ m | tojson }}{% endgeneration %}"
        "{%- else %}{{ m.content | upper }}{% endif %}\n{%- endfor -%}"
        "{{ ns.n }} {{ dict(a=1) | tojson }} {{ eos_token }} {{ enable_thinking }}"
        "{% if tools %}{{ tools | tojson(indent=2) }}{% endif %}"
    )
    folder = save("qwen2", tmp_path)
    (folder / "chat_template.jinja").write_text(template)
    ours = Tokenizer.from_pretrained(folder)
    theirs = transformers.AutoTokenizer.from_pretrained(folder)
    tools = [{"type": "function", "function": {"name": "speak", "parameters": {}}}]
    kwargs = {"tokenize": False, "tools": tools, "enable_thinking": False}
    assert ours.apply_chat_template(MESSAGES, **kwargs) == theirs.apply_chat_template(
        MESSAGES, **kwargs
    )


def test_a_template_cannot_reach_python_internals(tmp_path):
    import jinja2

    folder = save("qwen2", tmp_path)
    (folder / "chat_template.jinja").write_text("{{ messages.__class__.__mro__ }}")
    with pytest.raises(jinja2.exceptions.SecurityError):
        Tokenizer.from_pretrained(folder).apply_chat_template(MESSAGES, tokenize=False)
    (folder / "chat_template.jinja").write_text("{% set ns = namespace() %}{% set ns._x = 1 %}")
    with pytest.raises(jinja2.exceptions.SecurityError, match="underscore"):
        Tokenizer.from_pretrained(folder).apply_chat_template(MESSAGES, tokenize=False)


def test_a_folder_without_a_template_says_how_to_give_one(tmp_path):
    folder = save("qwen2", tmp_path)
    (folder / "chat_template.jinja").unlink()
    ours = Tokenizer.from_pretrained(folder)
    with pytest.raises(ChatTemplateError, match="chat_template="):
        ours.apply_chat_template(MESSAGES)
    assert ours.apply_chat_template(MESSAGES[:1], chat_template="{{ messages[0].content }}") == (
        ours.encode("You speak briefly.")
    )


def test_a_folder_without_tokenizer_json_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        Tokenizer.from_pretrained(tmp_path)
