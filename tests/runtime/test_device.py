"""DeviceService: dtype rules over made-up devices, simulated memory, OOM recognition, placement."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from mizuoto_runtime.devices.device import DeviceService, is_oom
from mizuoto_runtime.devices.dtypes import DeviceProperties
from mizuoto_sdk import EngineError

PREFERENCE = ["bf16", "fp16", "fp32"]
T4 = DeviceProperties("cuda", "Tesla T4", (7, 5))
A100 = DeviceProperties("cuda", "NVIDIA A100-SXM4-80GB", (8, 0))
GTX1650 = DeviceProperties("cuda", "NVIDIA GeForce GTX 1650", (7, 5))
MI300 = DeviceProperties("cuda", "AMD Instinct MI300X", (9, 4), hip=True)
OLD_MAC = DeviceProperties("mps", macos=(13, 6))
NEW_MAC = DeviceProperties("mps", macos=(14, 2))
ARC = DeviceProperties("xpu", "Intel Arc A770", bf16=True, fp64=False)


def service(**properties: DeviceProperties) -> DeviceService:
    return DeviceService(properties={k.replace("_", ":"): v for k, v in properties.items()})


@pytest.mark.parametrize(
    ("props", "expected", "skipped"),
    [
        (A100, "bfloat16", []),
        (MI300, "bfloat16", []),
        (T4, "float16", ["bfloat16"]),
        (GTX1650, "float32", ["bfloat16", "float16"]),
        (OLD_MAC, "float16", ["bfloat16"]),
        (NEW_MAC, "bfloat16", []),
        (ARC, "bfloat16", []),
    ],
)
def test_preference_order_skips_what_the_device_cannot_do(props, expected, skipped):
    choice = service(cuda_0=props).pick_dtype("cuda:0", None, PREFERENCE)
    assert choice.dtype == expected
    assert [r.split()[0] for r in choice.reasons] == skipped
    assert all("skipped:" in r for r in choice.reasons)


def test_cpu_computes_in_float32_unless_asked():
    devices = DeviceService()
    assert devices.pick_dtype("cpu", None, PREFERENCE).dtype == "float32"
    assert devices.pick_dtype("cpu", "bf16", PREFERENCE).dtype == "bfloat16"
    assert devices.pick_dtype("cpu", None, ["bf16"]).dtype == "bfloat16"  # the engine has no fp32
    assert devices.pick_dtype("cpu", None, PREFERENCE, cpu="bfloat16").dtype == "bfloat16"


def test_a_request_the_device_cannot_honour_falls_back_with_the_reason():
    choice = service(cuda_0=T4).pick_dtype("cuda:0", "bfloat16", PREFERENCE)
    assert choice.dtype == "float16"
    assert "compute capability 8.0" in choice.reasons[0]


def test_a_dtype_the_engine_lacks_is_an_invalid_request():
    with pytest.raises(EngineError) as caught:
        DeviceService().pick_dtype("cpu", "fp16", ["fp32"])
    assert caught.value.code == "invalid_request" and caught.value.detail["field"] == "dtype"


def test_no_workable_dtype_is_compute_unavailable():
    with pytest.raises(EngineError) as caught:
        service(cuda_0=GTX1650).pick_dtype("cuda:0", None, ["fp16"])
    assert caught.value.code == "compute_unavailable"
    assert "GTX 16xx" in str(caught.value)


def test_float64_runs_on_the_cpu_where_the_device_has_none():
    devices = service(mps=NEW_MAC, xpu_0=ARC, cuda_0=A100)
    assert devices.float64_device("mps") == "cpu"
    assert devices.float64_device("xpu:0") == "cpu"
    assert devices.float64_device("cuda:0") == "cuda:0"
    assert not devices.supports("mps", "float64") and devices.supports("cuda:0", "float64")


def test_simulated_cpu_reports_its_budget_and_accounts_placements():
    devices = DeviceService(simulate={"cpu": 1000})
    assert devices.is_accelerator("cpu") and devices.memory("cpu") == (1000, 1000)
    devices.meter("cpu").charge(300)
    assert devices.memory("cpu") == (700, 1000)
    devices.meter("cpu").charge(-300)
    assert devices.memory("cpu") == (1000, 1000)
    assert not DeviceService().is_accelerator("cpu")
    with pytest.raises(ValueError, match="simulate"):
        DeviceService(simulate={"cpu": 0})


def test_real_cpu_memory_is_plausible():
    free, total = DeviceService().memory("cpu")
    assert 0 < free <= total


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB"), True),
        (RuntimeError("CUDA error: out of memory"), True),
        (RuntimeError("MPS backend out of memory (MPS allocated: 1 GB)"), True),
        (RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory"), True),
        (MemoryError(), True),
        (RuntimeError("shape mismatch"), False),
        (ValueError("out of memory"), False),  # only allocator errors, not any text
    ],
)
def test_is_oom(error, expected):
    assert is_oom(error) is expected


def test_pin_to_cpu_keeps_a_module_on_the_cpu_when_its_parent_moves():
    parent = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    DeviceService.pin_to_cpu(parent[1])
    parent.to("meta")  # stands in for any accelerator: tensors leave the CPU
    assert parent[0].weight.device.type == "meta"
    assert parent[1].weight.device.type == "cpu"
    parent.to(torch.float64)
    assert parent[1].weight.dtype == torch.float64 and parent[1].weight.device.type == "cpu"


def test_device_module_prints_torchs_view_and_probing_never_imports_torch_here():
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_runtime.devices.device"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    report = json.loads(done.stdout)
    assert report["torch"] == torch.__version__
    assert isinstance(report["devices"], list)
    script = (
        "import sys; from mizuoto_runtime.devices.device import DeviceService; "
        "d = DeviceService(); d.probe_devices(); b = d.torch_build(); "
        "print('torch' in sys.modules, b['version'], b['build'])"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True
    )
    imported, version, build = done.stdout.split()
    assert imported == "False"
    assert version == torch.__version__
    expected = "cpu" if torch.version.cuda is None and torch.version.hip is None else build
    assert build == expected
