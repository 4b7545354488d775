"""The shape of a SpeechBrain ECAPA-TDNN, read from the ``hyperparams.yaml`` its Hub folder ships.

SpeechBrain folders (``speechbrain/spkrec-ecapa-voxceleb`` and its kin) carry no ``config.json``:
the network is the ``embedding_model:`` entry of ``hyperparams.yaml``, a HyperPyYAML mapping
tagged ``!new:speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN`` whose values may be
``!ref <name>`` references to top-level keys (``input_size: !ref <n_mels>``). Only that entry is
read: PyYAML parses the file with every ``!`` tag kept as an inert marker (nothing is imported or
constructed), a plain ``!ref <name>`` is resolved against the top-level keys, and anything else
that would change the network (another class, another activation, a reference with arithmetic)
is refused naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from mizuoto_sdk.errors import EngineUnavailable

__all__ = ["EcapaConfig", "Tagged", "read_hyperparams"]

_CLASS = "speechbrain.lobes.models.ECAPA_TDNN.ECAPA_TDNN"
_RELU = ("torch.nn.ReLU", "torch.nn.modules.activation.ReLU")
# Upstream's keyword defaults; ``input_size`` has none.
_DEFAULTS: dict[str, Any] = {
    "lin_neurons": 192,
    "channels": [512, 512, 512, 512, 1536],
    "kernel_sizes": [5, 3, 3, 3, 1],
    "dilations": [1, 2, 3, 4, 1],
    "attention_channels": 128,
    "res2net_scale": 8,
    "se_channels": 128,
    "global_context": True,
    "groups": None,  # upstream's [1, 1, 1, 1, 1]: one group per layer
}
# Accepted and without effect here: the device is the loader's, dropout is off in eval.
_INERT = ("device", "dropout")


@dataclass(frozen=True)
class Tagged:
    """A HyperPyYAML-tagged node kept as data: ``tag`` without its ``!``, ``value`` as parsed."""

    tag: str
    value: Any


@dataclass(frozen=True)
class EcapaConfig:
    """The arguments of SpeechBrain's ``ECAPA_TDNN`` that shape the network.

    ``groups`` holds one entry per layer as upstream indexes its list: ``groups[i]`` for the first
    TDNN and each SE-Res2Net layer, ``groups[-1]`` for the multi-layer feature aggregation.
    """

    input_size: int
    channels: tuple[int, ...]
    kernel_sizes: tuple[int, ...]
    dilations: tuple[int, ...]
    attention_channels: int
    lin_neurons: int
    res2net_scale: int
    se_channels: int
    global_context: bool
    groups: tuple[int, ...]

    @classmethod
    def from_dict(cls, entry: Mapping[str, Any]) -> EcapaConfig:
        """Upstream's defaults for absent fields; a value upstream would not build or run is
        ``EngineUnavailable`` naming the field."""
        unknown = sorted(
            k
            for k in entry
            if k not in _DEFAULTS and k not in (*_INERT, "input_size", "activation")
        )
        if unknown:
            raise EngineUnavailable(
                f"ECAPA_TDNN config: {', '.join(unknown)}: not an argument of upstream's "
                f"ECAPA_TDNN; known: input_size, activation, {', '.join(_DEFAULTS)}"
            )
        activation = entry.get("activation")
        if activation is not None and not (
            isinstance(activation, Tagged) and activation.tag.removeprefix("name:") in _RELU
        ):
            raise EngineUnavailable(
                "ECAPA_TDNN config: activation: only torch.nn.ReLU is built, got "
                f"{_show(activation)}"
            )
        if "input_size" not in entry:
            raise EngineUnavailable(
                "ECAPA_TDNN config: input_size: required (upstream has no default), absent"
            )
        get = {**_DEFAULTS, **{k: v for k, v in entry.items() if k in _DEFAULTS}}
        try:
            channels = _ints(get, "channels")
            given = (1,) * len(channels) if get["groups"] is None else _ints(get, "groups")
            if len(given) < len(channels) - 1:
                raise ValueError(
                    f"groups: expected at least {len(channels) - 1} entries (upstream indexes "
                    f"one per layer), got {list(given)}"
                )
            # Upstream's indexing: groups[i] for layer i, groups[-1] for the aggregation.
            groups = (*given[: len(channels) - 1], given[-1])
            out = cls(
                input_size=_positive(entry, "input_size"),
                channels=channels,
                kernel_sizes=_ints(get, "kernel_sizes"),
                dilations=_ints(get, "dilations"),
                attention_channels=_positive(get, "attention_channels"),
                lin_neurons=_positive(get, "lin_neurons"),
                res2net_scale=_positive(get, "res2net_scale"),
                se_channels=_positive(get, "se_channels"),
                global_context=_bool(get, "global_context"),
                groups=groups,
            )
        except (TypeError, ValueError) as error:
            raise EngineUnavailable(f"ECAPA_TDNN config: {error}") from error
        return out._checked()

    def _checked(self) -> EcapaConfig:
        layers = len(self.channels)
        if layers < 3:
            # The aggregation concatenates the SE-Res2Net outputs; with none it has no input.
            raise EngineUnavailable(
                "ECAPA_TDNN config: channels: expected at least 3 layers (a TDNN, one or more "
                f"SE-Res2Net layers, the aggregation), got {list(self.channels)}"
            )
        for name in ("kernel_sizes", "dilations"):
            if len(getattr(self, name)) != layers:
                raise EngineUnavailable(
                    f"ECAPA_TDNN config: {name}: expected one entry per layer of channels "
                    f"({layers}), got {list(getattr(self, name))}"
                )
        c = self.channels
        convs = [(self.input_size, c[0], self.groups[0])]
        convs += [(c[i - 1], c[i], self.groups[i]) for i in range(1, len(c) - 1)]
        convs += [(c[-2] * (len(c) - 2), c[-1], self.groups[-1])]
        for index, (inputs, outputs, groups) in enumerate(convs):
            if inputs % groups or outputs % groups:
                raise EngineUnavailable(
                    f"ECAPA_TDNN config: groups: layer {index} has {inputs} input and {outputs} "
                    f"output channels, not both divisible by its {groups} groups"
                )
        for i in range(1, len(c) - 1):
            if c[i] % self.res2net_scale:
                raise EngineUnavailable(
                    f"ECAPA_TDNN config: res2net_scale: {self.res2net_scale} does not divide "
                    f"channels[{i}] = {c[i]} (upstream asserts it)"
                )
            reach = self.dilations[i] * (self.kernel_sizes[i] - 1)
            if self.res2net_scale > 1 and reach % 2:
                # "same" padding pads reach // 2 each side, so an odd reach shortens the branch
                # and upstream's residual sums fail.
                raise EngineUnavailable(
                    f"ECAPA_TDNN config: kernel_sizes: layer {i}'s kernel {self.kernel_sizes[i]} "
                    f"with dilation {self.dilations[i]} does not keep the length "
                    "(dilation * (kernel - 1) must be even)"
                )
        return self

    def paddings(self) -> tuple[int, ...]:
        """Each layer's "same" padding per side: SpeechBrain's ``get_padding_elem`` at stride 1
        is ``dilation * (kernel - 1) // 2``."""
        return tuple(
            d * (k - 1) // 2 for k, d in zip(self.kernel_sizes, self.dilations, strict=True)
        )


def read_hyperparams(folder: str | PathLike[str]) -> dict[str, Any]:
    """The ``embedding_model:`` entry of ``FOLDER/hyperparams.yaml``, references resolved."""
    path = Path(folder) / "hyperparams.yaml"
    try:
        import yaml  # type: ignore[import-untyped]  # ships no stubs
    except ImportError:
        raise EngineUnavailable(
            f"{path}: reading SpeechBrain's hyperparams.yaml needs PyYAML (pip install pyyaml)"
        ) from None
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise EngineUnavailable(
            f"{folder}: no hyperparams.yaml (a SpeechBrain folder as the Hub ships it)"
        ) from None
    except OSError as error:
        raise EngineUnavailable(f"{path}: not readable: {error}") from error

    class _Loader(yaml.SafeLoader):
        pass

    def _tagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Tagged:
        value: Any
        if isinstance(node, yaml.MappingNode):
            value = loader.construct_mapping(node, deep=True)
        elif isinstance(node, yaml.SequenceNode):
            value = loader.construct_sequence(node, deep=True)
        else:
            value = loader.construct_scalar(node)
        return Tagged(suffix, value)

    _Loader.add_multi_constructor("!", _tagged)
    try:
        document = yaml.load(text, Loader=_Loader)  # a SafeLoader: nothing is constructed
    except yaml.YAMLError as error:
        raise EngineUnavailable(f"{path}: not readable YAML: {error}") from error
    if not isinstance(document, dict) or "embedding_model" not in document:
        raise EngineUnavailable(f"{path}: no embedding_model entry")
    entry = document["embedding_model"]
    if not isinstance(entry, Tagged) or entry.tag != f"new:{_CLASS}":
        raise EngineUnavailable(
            f"{path}: embedding_model: expected !new:{_CLASS}, got {_show(entry)}"
        )
    if entry.value in (None, ""):
        return {}
    if not isinstance(entry.value, dict):
        raise EngineUnavailable(f"{path}: embedding_model: expected keyword arguments (a mapping)")
    return {key: _resolve(document, key, value, ()) for key, value in entry.value.items()}


def _resolve(document: Mapping[str, Any], field: str, value: Any, seen: tuple[str, ...]) -> Any:
    if not (isinstance(value, Tagged) and value.tag == "ref"):
        return value
    target = str(value.value).strip()
    name = target[1:-1] if target.startswith("<") and target.endswith(">") else ""
    if not name or "<" in name or name not in document or name in seen:
        raise EngineUnavailable(
            f"ECAPA_TDNN config: {field}: only a plain !ref <key> to a top-level key is read, "
            f"got !ref {target}"
        )
    return _resolve(document, field, document[name], (*seen, name))


def _show(value: object) -> str:
    return f"!{value.tag}" if isinstance(value, Tagged) else repr(value)


def _positive(config: Mapping[str, Any], name: str) -> int:
    value = config[name]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {_show(value)}")
    return value


def _ints(config: Mapping[str, Any], name: str) -> tuple[int, ...]:
    value = config[name]
    if not isinstance(value, Sequence) or isinstance(value, str) or not value:
        raise ValueError(
            f"{name}: expected a non-empty list of positive integers, got {_show(value)}"
        )
    return tuple(_positive({name: v}, name) for v in value)


def _bool(config: Mapping[str, Any], name: str) -> bool:
    value = config[name]
    if not isinstance(value, bool):
        raise ValueError(f"{name}: expected true or false, got {_show(value)}")
    return value
