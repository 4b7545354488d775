"""Model files: manifest sources, the model cache's status, pull (resumed, verified, atomic), rm,
and loading a model that is not installed. Servers are loopback; the Hub cache is offline."""

from __future__ import annotations

import importlib
import os
from pathlib import Path

import pytest

from mizuoto_sdk import (
    EngineManifest,
    FolderSource,
    HubSource,
    ModelEntry,
    ModelFile,
    ModelNotInstalled,
    PackageSource,
    UrlSource,
)
from mizuoto_sdk.host import Discovery, RuntimeService
from mizuoto_sdk.host.models import ModelStore, model_cache

SITE = Path(__file__).parent / "models_site"
SHA = "ab" * 32


@pytest.fixture
def fixture(monkeypatch):
    monkeypatch.syspath_prepend(str(SITE))
    package = importlib.import_module("mizuoto_fixture_models")
    server_module = importlib.import_module("mizuoto_fixture_models.server")
    with server_module.FileServer() as server:
        monkeypatch.setenv("MIZUOTO_FIXTURE_MODELS_URL", server.url)
        discovery = Discovery(path=[str(SITE)], selection=None)
        yield package, server, discovery.manifest("fetched"), discovery


def _files(folder: Path) -> dict[str, bytes]:
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize(
    ("build", "field"),
    [
        (lambda: ModelFile("a.bin", 1, "xyz"), "sha256"),
        (lambda: ModelFile("a.bin", -1, SHA), "size"),
        (lambda: ModelFile("../a.bin", 1, SHA), "path"),
        (lambda: ModelFile("a.bin", 1, SHA, url="ftp://x/a"), "url"),
        (lambda: HubSource("o/n", "main", [ModelFile("a", 1, SHA)]), "revision"),
        (lambda: HubSource("o/n", "0" * 40, []), "files"),
        (lambda: UrlSource([ModelFile("a", 1, SHA)]), "files"),
        (lambda: ModelEntry("m", files="pkg:w", source=FolderSource("/w")), "source"),
    ],
)
def test_a_bad_declaration_names_its_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


def test_old_files_strings_become_sources_and_keep_loading():
    assert ModelEntry("m", files="pkg:weights").source == PackageSource("pkg:weights")
    assert ModelEntry("m", files="/srv/m").source == FolderSource("/srv/m")
    assert ModelEntry("m").source is None
    assert ModelFile("a", 1, SHA.upper()).sha256 == SHA


def test_pull_from_urls_installs_a_verified_copy_with_progress(fixture, tmp_path):
    package, _, manifest, _ = fixture
    store = ModelStore(tmp_path)
    entry = manifest.model("url")
    assert store.status("fetched", entry).state == "missing"
    seen = []
    status = store.pull("fetched", entry, lambda path, done, total: seen.append((done, total)))
    assert status.state == "installed"
    assert _files(status.folder) == package.FILES
    total = sum(map(len, package.FILES.values()))
    assert seen[-1] == (total, total) and all(d <= t for d, t in seen)
    assert store.status("fetched", entry, verify=True).state == "installed"


def test_a_pull_that_stops_mid_file_leaves_nothing_loadable_and_resumes(fixture, tmp_path):
    package, server, manifest, _ = fixture
    store, entry = ModelStore(tmp_path), manifest.model("url")
    server.cut.add("weights.bin")
    with pytest.raises(ModelNotInstalled, match=r"weights\.bin") as failed:
        store.pull("fetched", entry)
    assert failed.value.detail["reason"] == "download_failed"
    assert store.status("fetched", entry).state == "missing"
    with pytest.raises(ModelNotInstalled, match="mizuoto models pull fetched:url"):
        store.require("fetched", entry)
    server.requests.clear()
    status = store.pull("fetched", entry)
    assert _files(status.folder) == package.FILES
    half = len(package.FILES["weights.bin"]) // 2
    assert ("weights.bin", f"bytes={half}-") in server.requests


def test_wrong_bytes_fail_verification_and_install_nothing(fixture, tmp_path):
    _, server, manifest, _ = fixture
    store, entry = ModelStore(tmp_path), manifest.model("url")
    server.wrong.add("weights.bin")
    with pytest.raises(ModelNotInstalled, match="sha256") as failed:
        store.pull("fetched", entry)
    assert failed.value.detail["reason"] == "verification_failed"
    assert not (tmp_path / "fetched" / "url").exists()
    server.wrong.clear()
    server.requests.clear()
    assert store.pull("fetched", entry).state == "installed"
    assert ("weights.bin", None) in server.requests  # fetched afresh, not resumed from bad bytes


def _hub_cache(root: Path, package) -> Path:
    """A Hub cache as huggingface_hub lays it out: blobs, a snapshot of links, refs/main."""
    repo = root / ("models--" + package.HUB_REPO.replace("/", "--"))
    snapshot = repo / "snapshots" / package.HUB_REVISION
    for path, data in package.FILES.items():
        blob = repo / "blobs" / package.sha256(data)
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        (snapshot / path).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / path).symlink_to(os.path.relpath(blob, (snapshot / path).parent))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(package.HUB_REVISION)
    return root


def test_pull_from_an_offline_hub_cache(fixture, tmp_path, monkeypatch):
    constants = pytest.importorskip("huggingface_hub.constants")
    package, _, manifest, _ = fixture
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(_hub_cache(tmp_path / "hf", package)))
    store = ModelStore(tmp_path / "cache")
    status = store.pull("fetched", manifest.model("hub"))
    assert status.state == "installed" and _files(status.folder) == package.FILES
    missing = HubSource(package.HUB_REPO, "f" * 40, [ModelFile("a.bin", 1, SHA)])
    with pytest.raises(ModelNotInstalled, match=r"a\.bin"):
        store.pull("fetched", ModelEntry("other", source=missing))
    assert store.status("fetched", ModelEntry("other", source=missing)).state == "missing"


def test_status_tells_corrupt_files_and_pull_repairs_them(fixture, tmp_path):
    package, _, manifest, _ = fixture
    store, entry = ModelStore(tmp_path), manifest.model("url")
    folder = store.pull("fetched", entry).folder
    (folder / "config" / "model.json").write_bytes(b"{}")
    status = store.status("fetched", entry)
    assert status.state == "corrupt" and "config/model.json" in status.problems[0]
    with pytest.raises(ModelNotInstalled, match=r"bytes, expected"):
        store.require("fetched", entry)
    size = len(package.FILES["weights.bin"])
    (folder / "weights.bin").write_bytes(bytes(size))
    (folder / "config" / "model.json").write_bytes(package.FILES["config/model.json"])
    assert store.status("fetched", entry).state == "installed"  # sizes only
    assert store.status("fetched", entry, verify=True).state == "corrupt"
    assert _files(store.pull("fetched", entry).folder) == package.FILES


def test_rm_removes_a_pulled_model(fixture, tmp_path):
    _, _, manifest, _ = fixture
    store, entry = ModelStore(tmp_path), manifest.model("url")
    store.pull("fetched", entry)
    assert store.remove("fetched", entry) is True
    assert store.status("fetched", entry).state == "missing"
    assert store.remove("fetched", entry) is False
    with pytest.raises(ModelNotInstalled, match="package"):
        store.remove("fetched", manifest.model("bundled"))


def test_the_host_refuses_a_model_that_is_not_installed(fixture, tmp_path):
    package, _, manifest, discovery = fixture
    service = RuntimeService({"models.cache": str(tmp_path)}, discovery)
    assert model_cache(service.settings) == tmp_path
    with pytest.raises(ModelNotInstalled, match="mizuoto models pull fetched:url") as failed:
        service.load("fetched", "url")
    assert failed.value.detail["command"] == "mizuoto models pull fetched:url"
    ModelStore(tmp_path).pull("fetched", manifest.model("url"))
    assert service.load("fetched", "url").call("files") == sorted(package.FILES)
    assert service.load("fetched", "bundled").call("files") == ["config/model.json"]


def test_a_manifest_without_sources_is_unchanged():
    manifest = EngineManifest(
        id="plain", implementation="x.y:Z", models=[ModelEntry("a")], capabilities=["call"]
    )
    assert ModelStore(Path("/nonexistent")).require("plain", manifest.model("a")) is None


def test_threads_pulling_one_model_at_once_fetch_it_once_and_all_see_it_installed(
    fixture, tmp_path
):
    import threading

    package, server, manifest, _ = fixture
    store = ModelStore(tmp_path / "cache")
    entry = manifest.model("url")
    start = threading.Barrier(4)
    states: list[str] = []
    errors: list[BaseException] = []

    def pull() -> None:
        start.wait()
        try:
            states.append(store.pull("fetched", entry).state)
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=pull) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == [] and states == ["installed"] * 4
    assert sorted(path for path, _ in server.requests) == sorted(package.FILES)  # once each
    assert _files(tmp_path / "cache" / "fetched" / "url") == package.FILES
