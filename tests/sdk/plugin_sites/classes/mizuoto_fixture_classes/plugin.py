"""One manifest per engine class of ``classes`` (see the package docstring)."""

from mizuoto_sdk import EngineManifest, ModelEntry, hookimpl

CLASSES = "mizuoto_fixture_classes.classes"
CPU = {"devices": ["cpu"]}
MANIFESTS = {
    "devices-disagree": (f"{CLASSES}:CudaOnly", CPU),
    "dtypes-disagree": (f"{CLASSES}:HalfFirst", CPU),
    "extras-disagree": (f"{CLASSES}:WantsAnAbsentExtra", CPU),
    "not-an-engine": (f"{CLASSES}:NotAnEngine", CPU),
    "final": (f"{CLASSES}:Final", CPU),
    "raises-on-import": ("mizuoto_fixture_classes.raises_on_import:Engine", CPU),
    "missing-class": (f"{CLASSES}:Absent", CPU),
    "declares-nothing": (
        f"{CLASSES}:DeclaresNothing",
        {
            "devices": ["cpu", "cuda"],
            "dtypes": ["bf16", "fp32"],
            "extras": {"mizuoto_absent_extra": "mizuoto-absent-extra>=1.0"},
        },
    ),
    "small": (f"{CLASSES}:Shared", CPU),
    "big": (f"{CLASSES}:Shared", {"devices": ["cpu", "cuda"]}),
}


@hookimpl
def mizuoto_engines():
    return [
        EngineManifest(
            id=engine_id,
            implementation=implementation,
            models=[ModelEntry("a")],
            capabilities=["synthesize"],
            **declared,
        )
        for engine_id, (implementation, declared) in MANIFESTS.items()
    ]
