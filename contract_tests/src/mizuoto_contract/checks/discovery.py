"""Checks on how the engine is found: cheap torch-free imports, a manifest its class agrees with."""

from __future__ import annotations

from typing import Any

from mizuoto_contract.outcome import Fail, Skip
from mizuoto_contract.registry import Check
from mizuoto_contract.subject import Subject
from mizuoto_sdk import EngineError
from mizuoto_sdk.host import Discovery

IMPORT_BUDGET_SECONDS = 1.5


def _plugin_module(subject: Subject) -> str | None:
    _, _, value = subject.record.entry_point.partition(" = ")
    module = value.partition(":")[0]
    if not module or not all(part.isidentifier() for part in module.split(".")):
        return None
    return module


def _imports(subject: Subject) -> dict[str, Any]:
    """One fresh interpreter for both import checks: the plugin module first (timed, as
    ``mizuoto engines`` imports it) and its hook called (as ``mizuoto engines`` calls it), then
    the implementation, as get_engine() imports it. Going through Discovery() would import every
    plugin module on the path."""
    cached = subject.shared.get("imports")
    if cached is not None:
        return cached
    module = _plugin_module(subject)
    implementation, _, qualname = subject.manifest.implementation.partition(":")
    cached = subject.run_child(
        f"""
        import importlib
        seen = {{}}
        if {module!r} is not None:
            start = time.perf_counter()
            plugin = importlib.import_module({module!r})
            seen["plugin"] = {{"seconds": time.perf_counter() - start,
                              "torch": "torch" in sys.modules}}
            hook = getattr(plugin, "mizuoto_engines", None)
            if callable(hook):
                try:
                    hook()
                except Exception:
                    pass  # a hook that fails is discovery's to report, not an import's
                seen["plugin"]["hook_torch"] = "torch" in sys.modules
        try:
            target = importlib.import_module({implementation!r})
            for part in {qualname!r}.split("."):
                target = getattr(target, part)
            seen["implementation"] = {{"torch": "torch" in sys.modules}}
        except Exception as error:
            seen["implementation"] = {{"error": f"{{type(error).__name__}}: {{error}}"}}
        print(json.dumps(seen))
    """,
        "the plugin module to import in a fresh interpreter",
        timeout=300,
    )
    subject.shared["imports"] = cached
    return cached


def import_cheap(subject: Subject) -> None:
    module = _plugin_module(subject)
    if module is None:
        raise Skip(f"{subject.engine_id} was not registered through an entry point")
    seen = _imports(subject)["plugin"]
    if seen["torch"]:
        raise Fail(f"importing {module} to leave torch unimported", "torch in sys.modules")
    if seen.get("hook_torch"):
        raise Fail(
            f"calling {module}.mizuoto_engines() to leave torch unimported",
            "torch in sys.modules after the hook returned",
        )
    if seen["seconds"] > IMPORT_BUDGET_SECONDS:
        raise Fail(
            f"importing {module} within {IMPORT_BUDGET_SECONDS} s", f"{seen['seconds']:.2f} s"
        )


def engine_import_torch_free(subject: Subject) -> None:
    seen = _imports(subject)
    plugin = seen.get("plugin", {})
    if plugin.get("torch") or plugin.get("hook_torch"):
        raise Skip("not run: the plugin module imported torch already (see discovery.import_cheap)")
    implementation = seen["implementation"]
    if "error" in implementation:
        raise Fail(
            f"{subject.manifest.implementation} to import in a fresh interpreter",
            implementation["error"],
        )
    if implementation["torch"]:
        raise Fail(
            f"importing {subject.manifest.implementation} to leave torch unimported",
            "torch in sys.modules after get_engine()",
        )


def class_matches_manifest(subject: Subject) -> None:
    if subject.record.status != "ok":
        raise Skip(
            f"not run: the engine is {subject.record.status}, so the host never imports its "
            "class (see discovery.api_compatible)"
        )
    try:
        subject.discovery.get_engine(subject.engine_id)
    except EngineError as error:
        raise Fail("the implementation to import and agree with the manifest", str(error)) from None


def api_compatible(subject: Subject) -> None:
    if subject.record.status != "ok":
        raise Fail(
            "status ok (a compatible api_version, a unique id)",
            f"{subject.record.status}: {subject.record.error}",
        )


def register_twice(subject: Subject) -> None:
    def manifests() -> list[object]:
        return [
            r.manifest
            for r in Discovery().records()
            if r.distribution == subject.record.distribution
        ]

    first, second = manifests(), manifests()
    if first != second:
        raise Fail(
            "the hook to return the same manifests every time it is called",
            f"{len(first)} manifests, then {len(second)} that differ",
        )


CHECKS = (
    Check(
        "discovery.import_cheap",
        "The entry-point module imports fast and without torch, and so does calling its hook.",
        "Listing engines imports every plugin module; one that imports torch or model code "
        "makes `mizuoto engines` slow for everybody and can initialise CUDA.",
        "Import only mizuoto_sdk in the plugin module and its hook; name the implementation as a "
        "string.",
        "core",
        import_cheap,
    ),
    Check(
        "discovery.engine_import_torch_free",
        "Importing the implementation module does not import torch.",
        "get_engine() runs before a device is chosen; torch waits for Engine.load.",
        "Move `import torch` (and model imports) inside load() and the methods that use it.",
        "core",
        engine_import_torch_free,
    ),
    Check(
        "discovery.class_matches_manifest",
        "The Engine class imports, and any DEVICES, DTYPES or EXTRAS it sets equal the manifest's.",
        "The host lists engines from the manifest and runs them from the class.",
        "Declare them in the manifest only, or make the class attributes equal to its fields.",
        "core",
        class_matches_manifest,
    ),
    Check(
        "discovery.api_compatible",
        "The plugin speaks this SDK's engine API and its engine id is unique.",
        "An engine built for another API major, or shadowed by another distribution, is not "
        "used at all.",
        "Set api_version to the SDK's API_VERSION; pick an id no other distribution uses.",
        "core",
        api_compatible,
    ),
    Check(
        "discovery.register_twice",
        "Calling the registration hook again returns the same manifests.",
        "Hosts, workers and tests discover plugins more than once in one process.",
        "Build manifests from constants in the hook; keep no state between calls.",
        "core",
        register_twice,
    ),
)
