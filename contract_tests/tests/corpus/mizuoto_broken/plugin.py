"""The shared plugin (distribution mizuoto-broken): the good engine and most broken ones.

Engines whose breakage is the plugin module itself, or would show on the whole distribution
(import_cheap, api_compatible, register_twice), have distributions of their own (see the
``*.dist-info`` folders), as have the engines that declare expected failures.
"""

from __future__ import annotations

from mizuoto_broken.manifests import BASE, broken, manifest
from mizuoto_sdk import EngineManifest, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        manifest("corpus-good", BASE, text_input=True),
        manifest("corpus-strict", "mizuoto_broken.strict:Engine", text_input=True),
        # The good engine, told by its manifest to be checked on one word: too short to cancel.
        manifest("corpus-one-word", BASE, sample_text="Hello."),
        manifest("corpus-counted", "mizuoto_broken.counted:Engine", text_input=True),
        # A backend that cannot be reproducible, and says so: every other check must pass.
        manifest(
            "corpus-nondeterministic", "mizuoto_broken.nondeterministic:Engine", deterministic=False
        ),
        # The thread-unsafe native engine of determinism.concurrent--strtok, declaring it.
        manifest(
            "corpus-strtok-serialised",
            "mizuoto_broken.determinism_concurrent__strtok:Engine",
            max_concurrency=1,
        ),
        broken("discovery.engine_import_torch_free"),
        broken("discovery.class_matches_manifest"),
        broken("load.device"),
        broken("load.global_state"),
        broken("load.global_state", variant="environ"),
        broken("load.global_state", variant="seed"),
        broken("load.global_state", variant="dependency"),
        broken("load.global_state", variant="numpy_draw"),
        broken("load.handles_declared"),
        broken("load.describe_json"),
        broken("load.describe_json", variant="after_call"),
        broken("determinism.fresh_loads"),
        broken("determinism.same_handle"),
        broken("determinism.same_handle", variant="seed"),
        broken("determinism.fresh_process"),
        broken("determinism.global_rng_independent"),
        broken("determinism.seed_matters"),
        broken("determinism.applied_seed"),
        broken("determinism.concurrent"),
        broken("determinism.concurrent", variant="deadlock"),
        broken("determinism.concurrent", variant="native_crash"),
        broken("determinism.concurrent", variant="texts"),
        broken("determinism.concurrent", variant="strtok"),
        broken("stream.generator"),
        broken("stream.lazy"),
        broken("stream.chunks_valid"),
        broken("stream.chunks_valid", variant="wrong_type"),
        broken("stream.chunks_valid", variant="rate_change"),
        broken("stream.chunks_valid", variant="digits"),
        broken("stream.chunks_valid", variant="seed"),
        broken("stream.chunks_valid", variant="convert", capabilities=["synthesize", "convert"]),
        broken("stream.equivalence"),
        broken("stream.early_close"),
        broken("stream.early_close", variant="late"),
        broken("stream.cancel"),
        broken("stream.cancel", variant="busy"),
        broken("stream.cancel", variant="used"),
        broken("stream.timeout"),
        broken("stream.reuse_after_abort"),
        broken("text_input.same_audio", text_input=True),
        broken("text_input.before_the_end", text_input=True),
        broken("text_input.abandoned", text_input=True),
        broken("globals.untouched"),
        broken("globals.untouched", variant="environ"),
        broken("globals.untouched", variant="gc"),
        broken("globals.untouched", variant="patched"),
        # Outside the package: the static scan reads an implementation's whole top-level package.
        broken("globals.static_scan", "mizuoto_broken_static:Engine"),
        broken(
            "globals.static_scan",
            "mizuoto_broken_globals_static_scan__concat:Engine",
            variant="concat",
        ),
        broken("resources.unload_releases"),
        broken("resources.unload_releases", variant="handles"),
        broken("resources.no_threads"),
        broken("resources.no_processes"),
        broken("resources.no_temp_files"),
        broken("resources.reload"),
        broken("resources.unload_releases", variant="weights"),
        broken("resources.unload_releases", variant="class_attribute"),
        broken("resources.no_threads", variant="import"),
        broken("resources.no_processes", variant="daemon"),
        broken("resources.no_temp_files", variant="home"),
        broken("resources.no_temp_files", variant="cwd"),
        broken("resources.no_temp_files", variant="socket"),
        broken("load.handles_declared", variant="helper"),
        broken("inputs.not_mutated"),
        broken(
            "inputs.not_mutated",
            variant="prepare_voice",
            capabilities=["synthesize", "prepare_voice"],
        ),
        broken("errors.unsupported", capabilities=["synthesize", "call"]),
        broken("errors.invalid_input"),
    ]
