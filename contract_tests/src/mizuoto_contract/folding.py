"""What a string expression of constants evaluates to, read from its syntax tree (nothing runs).

The static scan (``mizuoto_contract.audit``) resolves ``getattr(torch, "manual_" + "seed")``,
``importlib.import_module(f"{'tor'}ch")`` or ``os.environ["".join(parts)]`` through it: string
constants and names bound to them, joined by ``+``, ``%``, f-strings, ``str.join`` and
``str.format``, sliced by constants (``"dees_launam"[::-1]``) and passed through str's pure
methods. Anything else (a call into a library, a value read at run time) is not folded: the
fresh process's diff sees what a spelling hides from the scan.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Mapping

_PURE_METHODS = frozenset(
    {
        "capitalize",
        "casefold",
        "lower",
        "lstrip",
        "removeprefix",
        "removesuffix",
        "replace",
        "rstrip",
        "strip",
        "swapcase",
        "title",
        "upper",
    }
)
_LONGEST = 10_000  # longer results ("x" * 10**9) are not folded
_WIDE = re.compile(r"\d{5,}")  # a field width that would build a huge string ("%99999999s")


def fold(node: ast.AST, names: Mapping[str, str] | None = None) -> str | None:
    """The string ``node`` always evaluates to, or None. ``names`` are variables known to hold
    strings (``NAME = "manual_seed"`` earlier in the module)."""
    try:
        value = _Folder(names or {}).value(node)
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError):
        return None  # a format that fails, or an expression nested too deep to read
    return value if isinstance(value, str) and len(value) <= _LONGEST else None


class _Folder:
    def __init__(self, names: Mapping[str, str]) -> None:
        self.names = names

    def value(self, node: ast.AST) -> object:
        """The constant (a str, or an int or tuple used in building one), or None."""
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int)):
            return node.value
        if isinstance(node, ast.Name):
            return self.names.get(node.id)
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [self.value(item) for item in node.elts]
            return None if None in items else tuple(items)
        if isinstance(node, ast.BinOp):
            return self._operation(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):  # "..."[::-1]
            number = self.value(node.operand)
            return -number if isinstance(number, int) else None
        if isinstance(node, ast.JoinedStr):
            parts = [self._formatted(part) for part in node.values]
            return None if None in parts else "".join(parts)  # type: ignore[arg-type]
        if isinstance(node, ast.Subscript):
            text, index = self.value(node.value), self._index(node.slice)
            return text[index] if isinstance(text, str) and index is not None else None
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _operation(self, node: ast.BinOp) -> object:
        left, right = self.value(node.left), self.value(node.right)
        if left is None or right is None:
            return None
        if isinstance(node.op, ast.Add) and isinstance(left, str) and isinstance(right, str):
            return left + right
        if isinstance(node.op, ast.Mod) and isinstance(left, str) and _narrow(left, right):
            return left % right
        if isinstance(node.op, ast.Mult):
            text, count = (left, right) if isinstance(left, str) else (right, left)
            if isinstance(text, str) and isinstance(count, int) and len(text) * count <= _LONGEST:
                return text * count
        return None

    def _formatted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if not isinstance(node, ast.FormattedValue):
            return None
        value = self.value(node.value)
        spec = "" if node.format_spec is None else self.value(node.format_spec)
        if value is None or not isinstance(spec, str) or _WIDE.search(spec):
            return None
        conversions: dict[int, Callable[[object], object]] = {
            ord("r"): repr,
            ord("a"): ascii,
            ord("s"): str,
        }
        return format(conversions.get(node.conversion, _same)(value), spec)

    def _index(self, node: ast.AST) -> int | slice | None:
        if isinstance(node, ast.Slice):
            given = (node.lower, node.upper, node.step)
            bounds = [None if b is None else self.value(b) for b in given]
            if any(
                b is not None and not isinstance(v, int) for b, v in zip(given, bounds, strict=True)
            ):
                return None
            return slice(*bounds)
        index = self.value(node)
        return index if isinstance(index, int) else None

    def _call(self, node: ast.Call) -> object:
        arguments = [self.value(argument) for argument in node.args]
        keywords = {k.arg: self.value(k.value) for k in node.keywords if k.arg is not None}
        if None in arguments or None in keywords.values() or len(keywords) < len(node.keywords):
            return None
        function = node.func
        if isinstance(function, ast.Name) and function.id == "str" and len(arguments) == 1:
            return arguments[0] if isinstance(arguments[0], str) else None
        if not isinstance(function, ast.Attribute):
            return None
        owner = self.value(function.value)
        if not isinstance(owner, str):
            return None
        if function.attr == "join" and len(arguments) == 1 and not keywords:
            parts = arguments[0]
            if isinstance(parts, tuple) and all(isinstance(p, str) for p in parts):
                return owner.join(parts)
            return None
        if function.attr == "format" and _narrow(owner, (*arguments, *keywords.values())):
            return owner.format(*arguments, **keywords)
        texts = [a for a in [*arguments, *keywords.values()] if isinstance(a, str)]
        longest = (len(owner) + 1) * (1 + sum(map(len, texts)))  # str.replace("", ...) at worst
        if function.attr in _PURE_METHODS and longest <= _LONGEST:
            return getattr(owner, function.attr)(*arguments, **keywords)
        return None


def _narrow(template: str, arguments: object) -> bool:
    """No field of ``template`` can be wide enough to build a huge string, whether its width is
    written in it (``%99999999s``) or passed as an argument (``%*s``, ``{:>{}}``)."""
    values = arguments if isinstance(arguments, tuple) else (arguments,)
    numbers = [v for v in values if isinstance(v, int)]
    return not _WIDE.search(template) and all(abs(n) <= _LONGEST for n in numbers)


def _same(value: object) -> object:
    return value
