"""Chat templates rendered as transformers renders them (``apply_chat_template``, 5.x).

A template comes from the tokenizer folder, which may come from anyone, so it runs in jinja2's
immutable sandbox with what transformers puts there and nothing more: ``trim_blocks`` and
``lstrip_blocks``, the loop controls, a ``{% generation %}`` block that renders its body,
``tojson`` without HTML escaping, ``raise_exception``, ``strftime_now``, ``dict`` and a
``namespace`` that refuses underscore names. Messages are copied to plain data first, so a
template cannot reach the caller's objects, and a message's reasoning is offered under the names
templates read (``reasoning_content`` and ``thinking``), as transformers does.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from mizuoto_runtime.text._extras import require

if TYPE_CHECKING:
    import jinja2

__all__ = ["ChatTemplateError", "pick_template", "render"]

_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplateError(ValueError):
    """No template to use, or a name that the folder's templates do not have."""


def pick_template(
    templates: str | Mapping[str, str] | None,
    chosen: str | None,
    has_tools: bool,
) -> str:
    """The template text: ``chosen`` (a name among ``templates``, or a template itself),
    else ``tool_use`` when tools are given and the folder has one, else ``default``."""
    if isinstance(templates, Mapping):
        if chosen is not None:
            return templates.get(chosen, chosen)
        if has_tools and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        raise ChatTemplateError(
            f"the folder has several chat templates ({', '.join(sorted(templates))}) and none "
            "is named 'default'; pass chat_template=<name>"
        )
    if chosen is not None:
        return chosen
    if templates is None:
        raise ChatTemplateError(
            "the folder has no chat template (neither chat_template.jinja nor a chat_template "
            "entry in tokenizer_config.json); pass chat_template=<jinja text>"
        )
    return templates


def render(
    template: str,
    messages: Sequence[Mapping[str, object]],
    *,
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, object]] | None,
    documents: Sequence[Mapping[str, object]] | None,
    variables: Mapping[str, object],
) -> str:
    """One conversation through ``template``; ``variables`` (the special tokens, the caller's
    keyword arguments) are what else the template sees."""
    chat = _plain(list(messages))
    for message in chat:
        if not isinstance(message, dict):
            raise TypeError(f"chat messages are dicts with 'role' and 'content', got {message!r}")
    chat = [_with_reasoning_aliases(message) for message in chat]
    return _compiled(template).render(
        messages=chat,
        tools=_plain(tools),
        documents=_plain(documents),
        add_generation_prompt=add_generation_prompt,
        **_plain(dict(variables)),
    )


def _plain(value: Any) -> Any:
    """A copy made of dicts, lists, strings, numbers and None only: what a template may see."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _with_reasoning_aliases(message: dict[str, Any]) -> dict[str, Any]:
    reasoning = next(
        (message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None
    )
    if reasoning is None:
        return message
    return {"thinking": reasoning, **message, "reasoning_content": reasoning}


@functools.lru_cache(maxsize=32)  # thread-safe; templates are few and compiling one is slow
def _compiled(template: str) -> jinja2.Template:
    require("jinja2", "a chat template")
    import jinja2.nodes
    import jinja2.parser
    import jinja2.utils
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` renders its body (it only marks the
        assistant's part for transformers' assistant-token mask, which this does not return)."""

        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    class Namespace(jinja2.utils.Namespace):
        def __init__(*args: Any, **kwargs: Any) -> None:  # jinja's signature: self may be a key
            self, args = args[0], args[1:]
            values = dict(*args, **kwargs)
            for name in values:
                _check_name(name)
            jinja2.utils.Namespace.__init__(self, values)

        def __setitem__(self, name: str, value: Any) -> None:
            _check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

    def _check_name(name: object) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(
                f"a chat template may not store the underscore name {name!r} on a namespace"
            )

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any,
        ensure_ascii: bool = False,
        indent: int | None = None,
        separators: tuple[str, str] | None = None,
        sort_keys: bool = False,
    ) -> str:
        return json.dumps(
            value,
            ensure_ascii=ensure_ascii,
            indent=indent,
            separators=separators,
            sort_keys=sort_keys,
        )

    class Dict:
        """``dict(...)`` and ``dict.fromkeys(...)``, without the type itself."""

        def __call__(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict[Any, Any]:
            return dict.fromkeys(*args, **kwargs)

    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols]
    )
    environment.filters["tojson"] = tojson
    environment.globals["raise_exception"] = raise_exception
    environment.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    environment.globals["dict"] = Dict()
    environment.globals["namespace"] = Namespace
    return environment.from_string(template)
