"""Declares engine ``fetched``: models ``url`` (from URLs), ``hub`` (Hub repository at a commit)
and ``bundled`` (package resource with declared files); ``hub`` names the files a local folder
(``engines.fetched.model_dir``) must hold."""

import os

from mizuoto_fixture_models import FILES, HUB_REPO, HUB_REVISION, sha256
from mizuoto_sdk import (
    EngineManifest,
    HubSource,
    ModelEntry,
    ModelFile,
    PackageSource,
    UrlSource,
    hookimpl,
)


@hookimpl
def mizuoto_engines():
    base = os.environ.get("MIZUOTO_FIXTURE_MODELS_URL", "http://127.0.0.1:9/")
    files = [ModelFile(p, len(d), sha256(d)) for p, d in FILES.items()]
    with_urls = [ModelFile(p, len(d), sha256(d), url=base + p) for p, d in FILES.items()]
    return [
        EngineManifest(
            id="fetched",
            implementation="mizuoto_fixture_models.engine:Fetched",
            models=[
                ModelEntry("url", source=UrlSource(with_urls)),
                ModelEntry(
                    "hub",
                    source=HubSource(HUB_REPO, HUB_REVISION, files),
                    required_files=["config/model.json", "weights.bin"],
                ),
                ModelEntry(
                    "bundled",
                    source=PackageSource("mizuoto_fixture_models:bundled", files[1:]),
                ),
            ],
            capabilities=["call"],
            devices=["cpu"],
            uses_torch=False,
        )
    ]
