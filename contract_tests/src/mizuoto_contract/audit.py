"""A static scan for code that changes process-global state, or runs attention outside accel.

Engines share one process with the host, each other and the tests, so native code never seeds the
global RNGs, edits the environment, cwd or sys.path, configures logging, or flips torch's global
switches. ``scan_tree`` reads Python sources (it imports nothing), resolves import aliases
(``import numpy as np``, ``from torch.backends import cudnn``) and names spelled as strings
(``getattr(torch, "manual_" + "seed")``, ``importlib.import_module(f"tor{'ch'}")``, ``setattr``:
the string folded by ``mizuoto_contract.folding``), and reports each banned call or assignment
with its rule. The SDK's architecture test runs it over this repository; the contract suite runs
it over third-party engines. A name only known at run time is beyond it: the fresh process's
diff (``mizuoto_contract.isolated``) sees what that spelling does.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import attrs

from mizuoto_contract.folding import fold

_CALLS: Mapping[str, tuple[str, ...]] = {
    "global_rng": (
        "torch.manual_seed",
        "torch.random.manual_seed",
        "torch.seed",
        "torch.random.seed",
        "torch.set_rng_state",
        "torch.random.set_rng_state",
        "torch.cuda.manual_seed",
        "torch.cuda.manual_seed_all",
        "torch.cuda.seed",
        "torch.cuda.seed_all",
        "torch.cuda.set_rng_state",
        "torch.cuda.set_rng_state_all",
        "torch.cuda.random.manual_seed",
        "torch.cuda.random.manual_seed_all",
        "torch.mps.manual_seed",
        "torch.mps.seed",
        "torch.xpu.manual_seed",
        "torch.xpu.manual_seed_all",
        "random.seed",
        "random.setstate",
        "numpy.random.seed",
        "numpy.random.set_state",
    ),
    "process_state": (
        "os.chdir",
        "os.fchdir",
        "os.putenv",
        "os.unsetenv",
        "sys.path.append",
        "sys.path.insert",
        "sys.path.extend",
        "sys.path.remove",
        "sys.path.pop",
        "sys.path.clear",
        "os.environ.update",
        "os.environ.setdefault",
        "os.environ.pop",
        "os.environ.popitem",
        "os.environ.clear",
        "os.environ.__setitem__",
        "os.environ.__delitem__",
    ),
    "logging_config": (
        "logging.basicConfig",
        "logging.config.dictConfig",
        "logging.config.fileConfig",
        "logging.disable",
    ),
    "torch_global": (
        "torch.set_default_dtype",
        "torch.set_default_tensor_type",
        "torch.set_default_device",
        "torch.use_deterministic_algorithms",
        "torch.set_deterministic_debug_mode",
        "torch.set_float32_matmul_precision",
        "torch.set_num_threads",
        "torch.set_num_interop_threads",
        "torch.set_flush_denormal",
        "torch.backends.cuda.enable_flash_sdp",
        "torch.backends.cuda.enable_mem_efficient_sdp",
        "torch.backends.cuda.enable_math_sdp",
        "torch.backends.cuda.enable_cudnn_sdp",
        "torch.backends.cuda.preferred_linalg_library",  # a setter only when given a value
    ),
    "warnings_filters": (
        "warnings.filterwarnings",
        "warnings.simplefilter",
        "warnings.resetwarnings",
    ),
    "attention": (
        "torch.nn.functional.scaled_dot_product_attention",
        "torch._C._nn.scaled_dot_product_attention",
    ),
}
_GETTERS_WITHOUT_ARGUMENTS = {"torch.backends.cuda.preferred_linalg_library"}
# Calls that change global state only as statements; as context managers they restore it.
_STATEMENT_CALLS = (
    "torch.set_grad_enabled",
    "torch.autograd.set_grad_enabled",
    "torch.autograd.set_detect_anomaly",
)
_ASSIGNED_PREFIXES = {
    "torch.backends": "torch_flags",
    "torch._inductor.config": "torch_flags",
    "torch._dynamo.config": "torch_flags",
    "os.environ": "process_state",
    "sys.path": "process_state",
}
HINTS: Mapping[str, str] = {
    "global_rng": "draw from ctx.generator_for(device) or ctx.rng instead of the global RNGs",
    "process_state": "pass paths and settings explicitly; never change cwd, sys.path or the "
    "environment of the shared process",
    "logging_config": "log through logging.getLogger(__name__); the host configures logging",
    "torch_global": "pass dtype/device explicitly and use context managers "
    "(torch.no_grad, torch.autocast); never change process-wide defaults",
    "torch_flags": "torch.backends and compiler config are process-wide and calls run "
    "concurrently: pass options per call instead (torch.compile(options=...))",
    "warnings_filters": "wrap the call in `with warnings.catch_warnings():`",
    "attention": "call mizuoto_runtime.accel.attention(q, k, v, site=...) instead",
    "syntax": "fix the file so that it parses",
}
_MODULES = {"torch", "os", "sys", "numpy", "random", "logging", "warnings", "builtins"}
# Calls that name an attribute or a module by a string (resolved when the string folds).
_GETATTR = ("getattr", "builtins.getattr")
_IMPORTS = ("importlib.import_module", "__import__", "builtins.__import__")
_SETTERS = ("setattr", "builtins.setattr", "delattr", "builtins.delattr")
_ITEM_SETTERS = ("operator.setitem", "operator.delitem", "operator.__setitem__")
# (path glob relative to the scanned root, function name or "*", rule): exempt.
# A rank process (a worker, or one an external launcher started) is the host's own: setting its
# thread count and device at startup is the one process-state change allowed there.
DEFAULT_ALLOW: tuple[tuple[str, str, str], ...] = (
    ("*mizuoto_runtime/accel/*", "*", "attention"),
    ("*mizuoto_sdk/host/binding.py", "bind_process", "torch_global"),
)
DEFAULT_EXCLUDE: tuple[str, ...] = (
    "tests/*",
    "*/tests/*",
    "test_*.py",
    "*/test_*.py",
    "conftest.py",
    "*/conftest.py",
)


@attrs.frozen
class Violation:
    path: str
    line: int
    rule: str
    what: str
    function: str

    @property
    def hint(self) -> str:
        return HINTS[self.rule]

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: [{self.rule}] {self.what} in {self.function}: {self.hint}"


class _Scanner(ast.NodeVisitor):
    def __init__(self, path: str) -> None:
        self.path = path
        self.aliases: dict[str, str] = {}
        self.strings: dict[str, str] = {}  # names bound to a string constant
        self.functions: list[str] = ["<module>"]
        self.catching_warnings = 0
        self.found: list[Violation] = []

    def _report(self, node: ast.AST, rule: str, what: str) -> None:
        self.found.append(
            Violation(self.path, getattr(node, "lineno", 0), rule, what, self.functions[-1])
        )

    def resolve(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.resolve(node.value)
            return None if base is None else f"{base}.{node.attr}"
        if isinstance(node, ast.Subscript):
            return self.resolve(node.value)
        if isinstance(node, ast.Call):
            return self._named_by_string(node)
        return None

    def _named_by_string(self, node: ast.Call) -> str | None:
        """``getattr(torch, "manual_" + "seed")`` is torch.manual_seed and
        ``importlib.import_module("tor" + "ch")`` is torch, when the string folds."""
        function = self.resolve(node.func)
        if function in _GETATTR and len(node.args) in (2, 3):
            owner, name = self.resolve(node.args[0]), fold(node.args[1], self.strings)
            return None if owner is None or name is None else f"{owner}.{name}"
        if function in _IMPORTS and node.args:
            module = fold(node.args[0], self.strings)
            if module is None or module.startswith("."):
                return None
            listed = node.args[3:4] or [k.value for k in node.keywords if k.arg == "fromlist"]
            # __import__("a.b") is the package a, unless a fromlist asks for a.b itself.
            if function != "importlib.import_module" and not (
                listed and isinstance(listed[0], (ast.List, ast.Tuple)) and listed[0].elts
            ):
                module = module.split(".")[0]
            return module
        return None

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.aliases[alias.asname] = alias.name
            else:
                top = alias.name.split(".")[0]
                self.aliases[top] = top

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.module and not node.level:
            for alias in node.names:
                self.aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def _function(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node.name)
        self.generic_visit(node)
        self.functions.pop()

    visit_FunctionDef = visit_AsyncFunctionDef = _function

    def _with(self, node: ast.With | ast.AsyncWith) -> None:
        catching = any(
            self.resolve(i.context_expr.func) == "warnings.catch_warnings"
            for i in node.items
            if isinstance(i.context_expr, ast.Call)
        )
        for item in node.items:  # a context-managed switch restores itself: skip its call
            expression = item.context_expr
            if isinstance(expression, ast.Call):
                for argument in [*expression.args, *(k.value for k in expression.keywords)]:
                    self.visit(argument)
            else:
                self.visit(expression)
        self.catching_warnings += catching
        for statement in node.body:
            self.visit(statement)
        self.catching_warnings -= catching

    visit_With = visit_AsyncWith = _with

    def visit_Expr(self, node: ast.Expr) -> None:
        if isinstance(node.value, ast.Call) and self.resolve(node.value.func) in _STATEMENT_CALLS:
            self._report(node, "torch_global", f"{self.resolve(node.value.func)}()")
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        name = self.resolve(node.func)
        if name is not None:
            getter = name in _GETTERS_WITHOUT_ARGUMENTS and not (node.args or node.keywords)
            for rule, names in _CALLS.items():
                if (
                    name in names
                    and not getter
                    and not (rule == "warnings_filters" and self.catching_warnings)
                ):
                    self._report(node, rule, f"{name}()")
            if name in _SETTERS and len(node.args) >= 2:
                attribute = fold(node.args[1], self.strings) or ""  # unknown: the owner's rule
                self._assigned(node, node.args[0], suffix=attribute)
            if name in _ITEM_SETTERS and node.args:
                self._assigned(node, node.args[0])
        self.generic_visit(node)

    def _assigned(self, node: ast.AST, target: ast.AST, suffix: str = "") -> None:
        name = self.resolve(target)
        if name is None or isinstance(target, ast.Name):
            return
        full = f"{name}.{suffix}" if suffix else name
        for prefix, rule in _ASSIGNED_PREFIXES.items():
            if full == prefix or full.startswith(prefix + "."):
                self._report(node, rule, f"assignment to {full}")
                return

    def visit_Assign(self, node: ast.Assign) -> None:
        for target in node.targets:
            self._assigned(node, target)
            self._alias(target, node.value)
        self.generic_visit(node)

    def _bind(self, target: ast.AST, value: ast.AST) -> None:
        """``NAME = "manual" + "_seed"``: later uses of NAME fold to the string."""
        if isinstance(target, ast.Name):
            text = fold(value, self.strings)
            if text is None:
                self.strings.pop(target.id, None)
            else:
                self.strings[target.id] = text

    def _alias(self, target: ast.AST, value: ast.AST) -> None:
        """``seed = torch.manual_seed`` or ``a, b = torch.backends.cuda, os.environ``: later uses
        of the local name resolve to what it was bound to."""
        if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)):
            for item, bound in zip(target.elts, value.elts, strict=False):
                self._alias(item, bound)
            return
        self._bind(target, value)
        if isinstance(target, ast.Name) and isinstance(value, (ast.Attribute, ast.Name, ast.Call)):
            name = self.resolve(value)
            if name is not None and name.split(".")[0] in _MODULES:
                self.aliases[target.id] = name

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self._assigned(node, node.target)
        if isinstance(node.target, ast.Name) and node.target.id in self.strings:
            joined = ast.BinOp(ast.Name(node.target.id, ast.Load()), node.op, node.value)
            self._bind(node.target, joined)
        self.generic_visit(node)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self._assigned(node, node.target)
            self._alias(node.target, node.value)
        self.generic_visit(node)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self._assigned(node, target)
        self.generic_visit(node)


def scan_source(source: str, path: str = "<string>") -> list[Violation]:
    """Every banned call or assignment in one module's source."""
    scanner = _Scanner(path)
    scanner.visit(ast.parse(source, filename=path))
    return scanner.found


def _allowed(violation: Violation, allow: Iterable[tuple[str, str, str]]) -> bool:
    return any(
        fnmatch.fnmatch(violation.path, path)
        and function in ("*", violation.function)
        and rule == violation.rule
        for path, function, rule in allow
    )


def scan_tree(
    root: str | Path,
    *,
    allow: Iterable[tuple[str, str, str]] = DEFAULT_ALLOW,
    exclude: Iterable[str] = DEFAULT_EXCLUDE,
) -> list[Violation]:
    """Scan every ``.py`` file under ``root`` (a folder or one file), minus tests.

    ``allow`` exempts (path glob, function, rule) triples; paths start with ``root``'s name. A file
    that does not parse is reported as a violation of rule ``syntax`` rather than skipped.
    """
    root = Path(root)
    files: Iterator[Path] = iter([root]) if root.is_file() else iter(sorted(root.rglob("*.py")))
    allow, exclude = tuple(allow), tuple(exclude)
    found: list[Violation] = []
    for file in files:
        # Paths start at the scanned folder's own name ("mizuoto_runtime/accel/policy.py"), so
        # the allowlist's globs match however deep the scan starts.
        relative = (
            file.name if root.is_file() else f"{root.name}/{file.relative_to(root).as_posix()}"
        )
        if any(fnmatch.fnmatch(relative, pattern) for pattern in exclude):
            continue
        try:
            violations = scan_source(file.read_text(encoding="utf-8"), relative)
        except (SyntaxError, UnicodeDecodeError) as error:
            found.append(
                Violation(
                    relative,
                    getattr(error, "lineno", 0) or 0,
                    "syntax",
                    f"cannot be parsed: {error}",
                    "<module>",
                )
            )
            continue
        found.extend(v for v in violations if not _allowed(v, allow))
    return found
