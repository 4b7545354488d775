"""The engine classes ``plugin`` names; ``Absent`` is missing on purpose."""

from mizuoto_sdk import Engine


class CudaOnly(Engine):
    """Says CUDA where its manifest says CPU."""

    DEVICES = ("cuda",)


class HalfFirst(Engine):
    """Prefers dtypes its manifest does not declare."""

    DEVICES = ("cpu",)
    DTYPES = ("bf16", "fp32")


class WantsAnAbsentExtra(Engine):
    """Needs an extra its manifest does not declare (a package no machine has)."""

    DEVICES = ("cpu",)
    EXTRAS = {"mizuoto_absent_extra": "mizuoto-absent-extra>=1.0"}


class NotAnEngine:
    DEVICES = ("cpu",)


class Final(Engine):
    """Refuses subclasses, so the SDK cannot give it the manifest's DTYPES and EXTRAS."""

    DEVICES = ("cpu",)

    def __init_subclass__(cls):
        raise TypeError("final")


class DeclaresNothing(Engine):
    """Leaves DEVICES, DTYPES and EXTRAS to its manifest."""


class Shared(Engine):
    """Serves engines ``small`` and ``big``, whose manifests declare different devices."""

    DTYPES = ("float32",)
