"""discovery.engine_import_torch_free: the implementation module imports torch at the top."""

from __future__ import annotations

import torch  # noqa: F401 - the breakage: get_engine() now imports torch

from mizuoto_broken.base import BaseEngine


class Engine(BaseEngine):
    pass
