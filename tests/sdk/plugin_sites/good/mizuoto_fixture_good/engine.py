"""The ``good`` engine class."""

from mizuoto_sdk import Engine


class Good(Engine):
    DEVICES = ("cpu",)
