"""An implementation module that imports torch at import time (allowed to work, worth a warning)."""

import torch

from mizuoto_sdk import Engine


class TorchAtImportEngine(Engine):
    DEVICES = ("cpu",)
    DTYPE = torch.float32
