"""The engine class both manifests name."""

from mizuoto_sdk import Engine


class Good(Engine):
    DEVICES = ("cpu",)
