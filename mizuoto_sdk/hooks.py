"""The hooks a plugin module implements, marked with ``mizuoto_sdk.hookimpl``."""

from __future__ import annotations

import pluggy

from mizuoto_sdk.manifest import EngineManifest

PROJECT = "mizuoto"
ENTRY_POINT_GROUP = "mizuoto.engines"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class EngineHooks:
    """Hook specifications. New hooks and new (opt-in) arguments are added, never changed."""

    @hookspec
    def mizuoto_engines(self) -> list[EngineManifest]:  # type: ignore[empty-body]  # a hook spec has no body
        """Return the manifests of the engines this plugin provides.

        Runs while engines are listed, so it must be cheap and import neither torch nor the
        engine implementation: the manifest names the implementation as a string instead.
        """


HOOK_NAMES: tuple[str, ...] = tuple(name for name in vars(EngineHooks) if name.startswith(PROJECT))
