"""The static scan bites on each banned pattern, through aliases, and spares the allowed ones."""

from __future__ import annotations

import ast
import textwrap

import pytest

from mizuoto_contract.audit import scan_source, scan_tree
from mizuoto_contract.folding import fold

BANNED = {
    "import torch\ntorch.manual_seed(0)": "global_rng",
    "import torch\ntorch.cuda.manual_seed_all(0)": "global_rng",
    "from torch import manual_seed as ms\nms(1)": "global_rng",
    "import numpy as np\nnp.random.seed(0)": "global_rng",
    "import random\nrandom.seed(0)": "global_rng",
    "import os\nos.chdir('/')": "process_state",
    "import os\nos.environ['X'] = '1'": "process_state",
    "from os import environ\nenviron['X'] = '1'": "process_state",
    "import os\nos.environ.update(X='1')": "process_state",
    "import os\ndel os.environ['X']": "process_state",
    "import os\nos.putenv('X', '1')": "process_state",
    "import sys\nsys.path.insert(0, 'x')": "process_state",
    "import sys\nsys.path[:] = []": "process_state",
    "import logging\nlogging.basicConfig()": "logging_config",
    "import torch\ntorch.set_default_dtype(torch.float64)": "torch_global",
    "import torch\ntorch.use_deterministic_algorithms(True)": "torch_global",
    "import torch\ntorch.set_grad_enabled(False)": "torch_global",
    "import torch\ntorch.backends.cudnn.benchmark = True": "torch_flags",
    "import torch.backends.cudnn as cudnn\ncudnn.deterministic = True": "torch_flags",
    "from torch.backends import cuda\ncuda.matmul.allow_tf32 = True": "torch_flags",
    "import torch\nsetattr(torch.backends.cudnn, 'benchmark', True)": "torch_flags",
    "import torch._inductor.config as c\nc.max_autotune = True": "torch_flags",
    "import torch\ntorch._dynamo.config.cache_size_limit += 8": "torch_flags",
    "import warnings\nwarnings.simplefilter('ignore')": "warnings_filters",
    "import torch.nn.functional as F\ndef f(q, k, v):\n"
    "    return F.scaled_dot_product_attention(q, k, v)": "attention",
    "from torch.nn.functional import scaled_dot_product_attention as a\na(1, 2, 3)": "attention",
    "import torch\nsdpa = torch.nn.functional.scaled_dot_product_attention\n"
    "sdpa(1, 2, 3)": "attention",
    "import torch\nseed = torch.manual_seed\nseed(0)": "global_rng",
    "import torch\ntorch.backends.cuda.preferred_linalg_library('magma')": "torch_global",
    "import torch\nmatmul, x = torch.backends.cuda.matmul, 1\n"
    "matmul.allow_tf32 = True": "torch_flags",
    # Names spelled as strings, folded.
    'import torch\ngetattr(torch, "manual_seed")(0)': "global_rng",
    'import torch\ngetattr(torch, "manual_" + "seed")(0)': "global_rng",
    "import torch\ngetattr(torch, f\"manual_{'seed'}\")(0)": "global_rng",
    'import torch\ngetattr(torch, "".join(["manual", "_", "seed"]))(0)': "global_rng",
    'import torch\ngetattr(torch, "%s_seed" % "manual")(0)': "global_rng",
    'import torch\ngetattr(torch, "{}_{}".format("manual", "seed"))(0)': "global_rng",
    'import torch\ngetattr(torch, "dees_launam"[::-1])(0)': "global_rng",
    'import torch\nNAME = "manual"\nNAME += "_seed"\ngetattr(torch, NAME)(0)': "global_rng",
    'import torch\nseed = getattr(torch, "manual_" + "seed")\nseed(0)': "global_rng",
    'import torch\ngetattr(torch.cuda, "manual_seed" + "_all", None)(0)': "global_rng",
    'import importlib\nimportlib.import_module("tor" + "ch").manual_seed(0)': "global_rng",
    'from importlib import import_module\nimport_module("numpy." + "random").seed(0)': "global_rng",
    'import importlib\nrng = importlib.import_module("ran" + "dom")\nrng.seed(0)': "global_rng",
    '__import__("ran" + "dom").seed(0)': "global_rng",
    '__import__("torch.cuda", fromlist=["x"]).manual_seed(0)': "global_rng",
    'import os\ngetattr(os, "env" + "iron")["X"] = "1"': "process_state",
    'import os\ngetattr(os, "environ").update(X="1")': "process_state",
    'import torch\nsetattr(torch.backends.cudnn, "bench" + "mark", True)': "torch_flags",
    'import torch\nsetattr(getattr(torch.backends, "cud" + "nn"), "benchmark", 1)': "torch_flags",
    'import importlib\nimportlib.import_module("torch.backends.cudnn").benchmark = True': (
        "torch_flags"
    ),
    'import operator, os\noperator.setitem(os.environ, "X", "1")': "process_state",
    'import warnings\ngetattr(warnings, "simple" + "filter")("ignore")': "warnings_filters",
}

ALLOWED = [
    "import torch\ng = torch.Generator().manual_seed(0)",
    "import numpy as np\nrng = np.random.default_rng(0)",
    "import torch\nwith torch.set_grad_enabled(False):\n    pass",
    "import torch\nenabled = torch.backends.cudnn.enabled",
    "import warnings\nwith warnings.catch_warnings():\n    warnings.simplefilter('ignore')",
    "import os\nvalue = os.environ.get('HOME')",
    "import os\nenv = dict(os.environ)\nenv['X'] = '1'",
    "import logging\nlog = logging.getLogger(__name__)",
    "import torch\nsdpa = torch.nn.functional.scaled_dot_product_attention\nf = sdpa",
    "import torch\nbackends = torch.backends\nflag = backends.cudnn.enabled",
    "import torch\nlibrary = torch.backends.cuda.preferred_linalg_library()",
    'import torch\ng = getattr(torch, "Generator")().manual_seed(0)',
    'import os\nhome = getattr(os, "environ").get("HOME")',
    'import importlib\nrng = importlib.import_module("numpy").random.default_rng(0)',
    'import torch\nenabled = getattr(torch.backends.cudnn, "en" + "abled")',
    'import torch\nNAME = "manual_seed"\nNAME = other()\ngetattr(torch, NAME)(0)',
    # A name only known at run time is the fresh process's to see, not the scan's.
    "import torch\ndef f(name):\n    getattr(torch, name)(0)",
    'import torch\nimport codecs\ngetattr(torch, codecs.decode("znahny_frrq", "rot13"))(0)',
]

FOLDED = {
    '"manual_" + "seed"': "manual_seed",
    "f\"manual_{'seed'}\"": "manual_seed",
    'f"{1:03d}"': "001",
    '"_".join(("manual", "seed"))': "manual_seed",
    '"%s_%s" % ("manual", "seed")': "manual_seed",
    '"{a}_{b}".format(a="manual", b="seed")': "manual_seed",
    '"MANUAL_SEED".lower()': "manual_seed",
    '"xmanual_seed"[1:]': "manual_seed",
    '"ab" * 2': "abab",
    "str('seed')": "seed",
    # Not constants, or too costly to build: not folded.
    "name + 'x'": None,
    "codecs.decode('x', 'rot13')": None,
    "'x' * 10**9": None,
    "'%*s' % (999999999, 'x')": None,
    "'{:>{}}'.format('x', 999999999)": None,
    "'%d' % 'x'": None,
}


@pytest.mark.parametrize("source", BANNED)
def test_each_banned_pattern_is_found_with_its_rule(source):
    (violation,) = scan_source(source, "engine.py")
    assert violation.rule == BANNED[source]
    assert violation.line == source.count("\n") + 1
    assert violation.hint and violation.path == "engine.py"


@pytest.mark.parametrize("source", ALLOWED)
def test_private_generators_reads_and_restoring_contexts_are_fine(source):
    assert scan_source(source) == []


@pytest.mark.parametrize("expression", FOLDED)
def test_string_expressions_of_constants_fold_and_nothing_else_does(expression):
    assert fold(ast.parse(expression, mode="eval").body) == FOLDED[expression]


def test_scan_tree_skips_tests_honours_the_allowlist_and_reports_unparsable_files(tmp_path):
    files = {
        "pkg/engine.py": "import torch\ndef load():\n    torch.manual_seed(0)\n",
        "pkg/tests/test_engine.py": "import torch\ntorch.manual_seed(0)\n",
        "pkg/mizuoto_runtime/accel/features.py": "import torch\ndef apply():\n"
        "    torch.backends.cudnn.benchmark = True\n"
        "def other():\n    torch.backends.cudnn.benchmark = False\n",
        "pkg/broken.py": "def (:\n",
    }
    for name, source in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    allow = [("*mizuoto_runtime/accel/features.py", "apply", "torch_flags")]
    found = {(v.path, v.rule, v.function) for v in scan_tree(tmp_path / "pkg", allow=allow)}
    assert found == {
        ("pkg/engine.py", "global_rng", "load"),
        ("pkg/mizuoto_runtime/accel/features.py", "torch_flags", "other"),
        ("pkg/broken.py", "syntax", "<module>"),
    }
    assert "ctx.generator_for" in str(next(v for v in scan_tree(tmp_path / "pkg/engine.py")))
    # By default nothing may set torch.backends flags, not even inside the runtime.
    default = {(v.function, v.rule) for v in scan_tree(tmp_path / "pkg/mizuoto_runtime")}
    assert default == {("apply", "torch_flags"), ("other", "torch_flags")}
