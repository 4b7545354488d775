"""prepare_voice checks its target before the engine runs: a typed error naming it, no OSError."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from mizuoto_sdk import AudioChunk, EngineError
from mizuoto_sdk.host import EngineRequest, RuntimeService

AUDIO = AudioChunk(np.zeros(16, np.float32), 16000)


@pytest.fixture
def handle(host_engine):
    service = RuntimeService(discovery=host_engine.discovery)
    return service.load(host_engine.engine_id, "a")


def dangling_link(root: Path) -> Path:
    (root / "voice").symlink_to(root / "missing")
    return root / "voice"


def link_loop(root: Path) -> Path:
    (root / "voice").symlink_to(root / "other")
    (root / "other").symlink_to(root / "voice")
    return root / "voice"


def link_to_itself(root: Path) -> Path:
    (root / "voice").symlink_to("voice")
    return root / "voice"


def a_file(root: Path) -> Path:
    (root / "voice").write_bytes(b"x")
    return root / "voice"


def a_folder_with_files(root: Path) -> Path:
    (root / "voice").mkdir()
    (root / "voice" / "old.npy").write_bytes(b"x")
    return root / "voice"


def under_a_file(root: Path) -> Path:
    (root / "file").write_bytes(b"x")
    return root / "file" / "voice"


def under_a_dangling_link(root: Path) -> Path:
    (root / "parent").symlink_to(root / "missing")
    return root / "parent" / "voice"


def under_a_link_loop(root: Path) -> Path:
    (root / "parent").symlink_to("parent")
    return root / "parent" / "voice"


def in_a_read_only_folder(root: Path) -> Path:
    (root / "locked").mkdir()
    (root / "locked").chmod(0o500)
    if os.access(root / "locked", os.W_OK):  # root writes anyway
        pytest.skip("this user can write into read-only folders")
    return root / "locked" / "voice"


def in_proc(root: Path) -> Path:
    if not sys.platform.startswith("linux"):
        pytest.skip("/proc is Linux's")
    return Path("/proc/mizuoto-voice")  # a folder that not even root can create entries in


@pytest.mark.parametrize(
    "make",
    [
        dangling_link,
        link_loop,
        link_to_itself,
        a_file,
        a_folder_with_files,
        under_a_file,
        under_a_dangling_link,
        under_a_link_loop,
        in_a_read_only_folder,
        in_proc,
    ],
)
def test_a_target_that_cannot_become_the_voice_is_refused_before_the_engine_runs(
    handle, tmp_path, make
):
    target = make(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    # The engine fails on purpose if it runs, so an invalid_request proves it never started.
    with pytest.raises(EngineError) as caught:
        handle.prepare_voice(AUDIO, target, EngineRequest(params={"mode": "raise"}))
    assert caught.value.code == "invalid_request"
    assert caught.value.detail["field"] == "voice_dir"
    assert str(target) in str(caught.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing staged, nothing moved


def test_a_link_to_an_empty_folder_fills_that_folder_and_stays_a_link(handle, tmp_path):
    root = tmp_path / "voices"
    (root / "real").mkdir(parents=True)
    (root / "voice").symlink_to(root / "real")
    assert handle.prepare_voice(AUDIO, root / "voice") == {"files": ["embedding.npy"]}
    assert (root / "voice").is_symlink()
    assert (root / "real" / "embedding.npy").read_bytes() == b"half"
    assert sorted(p.name for p in root.iterdir()) == ["real", "voice"]


def test_the_longest_name_the_file_system_accepts_is_a_voice_folder(handle, tmp_path):
    root = tmp_path / "voices"
    root.mkdir()
    name = "v" * os.pathconf(root, "PC_NAME_MAX")
    handle.prepare_voice(AUDIO, root / name)
    assert (root / name / "embedding.npy").is_file()
    assert [p.name for p in root.iterdir()] == [name]
