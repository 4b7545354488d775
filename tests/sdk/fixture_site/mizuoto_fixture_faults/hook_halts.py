"""A plugin whose hook raises a BaseException that is neither SystemExit nor KeyboardInterrupt."""

from mizuoto_sdk import hookimpl


class Halt(BaseException):
    pass


@hookimpl
def mizuoto_engines():
    raise Halt("the hook stopped on purpose")
