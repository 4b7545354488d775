"""``ComputeSettings``: the ``compute.*`` settings as one frozen, validated value.

Every compute setting is declared here once, with its default and its check; the host's settings
file, the request context (``ctx.compute``), the memory policy and the runtime all read this type,
so a default never differs between readers and a misspelt name is an error rather than a setting
that silently does nothing. Torch-free, so both the contract and the host can import it.
"""

from __future__ import annotations

import difflib
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from mizuoto_sdk.errors import InvalidRequest

__all__ = ["ATTENTION_POLICIES", "KV_CACHES", "PREFIX", "ComputeSettings"]

PREFIX = "compute."
ATTENTION_POLICIES = ("auto", "sdpa", "math", "flash", "xformers", "sage")
KV_CACHES = ("dynamic", "static")

# Names that were settings once: name -> why it is ignored. Warned about for one release.
_RETIRED: Mapping[str, str] = {
    "fast": "it never had an effect (torch's TF32 switches are process-wide, so they cannot be "
    "set for one call while other calls run) and is ignored; remove it from your settings",
}

Check = Callable[[str, object], object]


def _finite(value: float) -> bool:
    """Whether ``value`` is a float that is not inf or NaN (an int too large for one is not)."""
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _positive_int_or_none(key: str, value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(
            f"{key}: expected an integer >= 1 or None, got {value!r}", {"field": key}
        )
    return value


def _number_or_none(
    what: str, minimum: float, *, exclusive: bool = False, least: tuple[float, str] | None = None
) -> Check:
    """A check for None or a finite real number >= ``minimum`` (> with ``exclusive``).

    ``least`` = (value, words) adds a smallest usable value that the bound alone does not say
    (a simulated device of 1e-9 MiB is > 0 but holds no byte).
    """
    bound = f"{'>' if exclusive else '>='} {minimum:g}"
    if least is not None:
        bound += f" (at least {least[1]})"

    def check(key: str, value: object) -> float | None:
        if value is None:
            return None
        if (
            not isinstance(value, int | float)
            or isinstance(value, bool)
            or not _finite(value)
            or not (value > minimum if exclusive else value >= minimum)
            or (least is not None and value < least[0])
        ):
            raise InvalidRequest(
                f"{key}: expected {what} {bound}, finite, or None, got {value!r}", {"field": key}
            )
        return value

    return check


def _boolean(key: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise InvalidRequest(f"{key}: expected true or false, got {value!r}", {"field": key})
    return value


def _choice(*allowed: str) -> Check:
    def check(key: str, value: object) -> str:
        if value not in allowed:
            raise InvalidRequest(
                f"{key}: expected one of {', '.join(allowed)}, got {value!r}", {"field": key}
            )
        return value

    return check


def _setting(default: object, check: Check, doc: str) -> Any:
    """A field whose check names the setting (``compute.<field>``) in its error."""

    def validate(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
        check(PREFIX + attribute.name, value)

    return attrs.field(default=default, validator=validate, metadata={"doc": doc})


@attrs.frozen(kw_only=True)
class ComputeSettings:
    """How every engine call runs; ``ComputeSettings()`` is the defaults.

    Read it from the call's context (``ctx.compute.kv_cache``); build it from dotted settings
    with ``from_settings``. Each field is the setting ``compute.<field>``.
    """

    max_resident_models: int | None = _setting(
        None, _positive_int_or_none, "models kept loaded at once; the least recently used go first"
    )
    attention: str = _setting(
        "auto", _choice(*ATTENTION_POLICIES), "attention kernel policy; auto runs the reference"
    )
    kv_cache: str = _setting("dynamic", _choice(*KV_CACHES), "the language models' key/value cache")
    compile: bool = _setting(False, _boolean, "torch.compile hot modules, eager on failure")
    cuda_graphs: bool = _setting(False, _boolean, "replay decode steps as CUDA graphs")
    # Memory management (mizuoto_runtime.memory.policy): simulate_vram_mb when the runtime is
    # created (the first load), the others each time a model registers on a device.
    simulate_vram_mb: float | None = _setting(
        None,
        _number_or_none("a number of MiB", 0, exclusive=True, least=(2**-20, "one byte, 2**-20")),
        "make the CPU act as a GPU of this many MiB (tests, planning)",
    )
    vram_headroom_mb: float | None = _setting(
        None, _number_or_none("a number of MiB", 0), "memory never planned for on a device"
    )
    stream_in_flight: int | None = _setting(
        None, _positive_int_or_none, "streamed units staged on a device at once"
    )
    working_margin: float | None = _setting(
        None, _number_or_none("a factor", 1), "factor on measured working peaks"
    )

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The field names, in declaration order (each the setting ``compute.<name>``)."""
        return tuple(field.name for field in attrs.fields(cls))

    @classmethod
    def from_settings(cls, settings: Mapping[str, object]) -> ComputeSettings:
        """The ``compute.*`` keys of ``settings`` (other keys are ignored), defaults elsewhere.

        An unknown ``compute.*`` key is an InvalidRequest naming it and the known ones; a retired
        one (``compute.fast``) warns (DeprecationWarning) and is ignored.
        """
        values: dict[str, Any] = {}  # each value is checked by its field's validator
        for key, value in settings.items():
            if (why := cls.retired(key)) is not None:
                warnings.warn(why, DeprecationWarning, stacklevel=2)
            elif (name := cls.field_of(key)) is not None:
                values[name] = value
        return cls(**values)

    @staticmethod
    def retired(key: object) -> str | None:
        """Why a retired key (``compute.fast``) is ignored; None for any other key."""
        if isinstance(key, str) and key.startswith(PREFIX) and key[len(PREFIX) :] in _RETIRED:
            return f"the setting {key} is deprecated: {_RETIRED[key[len(PREFIX) :]]}"
        return None

    @classmethod
    def field_of(cls, key: object) -> str | None:
        """The field a dotted key sets; None for a key outside ``compute.*`` or a retired one.

        An unknown ``compute.*`` key is an InvalidRequest naming it and the known names.
        """
        if not isinstance(key, str) or not key.startswith(PREFIX) or cls.retired(key):
            return None
        name = key[len(PREFIX) :]
        known = cls.names()
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"did you mean {PREFIX}{close[0]}? " if close else ""
            raise InvalidRequest(
                f"unknown setting {key!r}; {hint}known compute settings: "
                + ", ".join(PREFIX + n for n in known),
                {"field": key},
            )
        return name

    def as_settings(self) -> dict[str, object]:
        """These values as dotted settings (``{"compute.attention": "auto", ...}``)."""
        return {PREFIX + name: value for name, value in attrs.asdict(self).items()}

    def replace(self, **changes: Any) -> ComputeSettings:
        """A copy with ``changes`` (field names), checked like the original."""
        return attrs.evolve(self, **changes)
