"""server.json: how a command finds the running server, and how a dead server's file is told."""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from mizuoto_sdk.server.record import (
    ServerRecord,
    live_record,
    pid_alive,
    read_record,
    record_path,
    remove_record,
    write_record,
)


def _record(pid: int, token: str | None = "s3cret") -> ServerRecord:
    return ServerRecord(
        url="http://127.0.0.1:7370",
        host="127.0.0.1",
        port=7370,
        pid=pid,
        version="1.2.3",
        token=token,
        started=1_700_000_000.5,
    )


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The pid of a process that has ended and been reaped."""
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    done.wait(timeout=60)
    return done.pid


def test_the_file_lives_in_the_data_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path / "home"))
    assert record_path() == tmp_path / "home" / "server.json"
    assert record_path(tmp_path / "other") == tmp_path / "other" / "server.json"


def test_a_written_record_reads_back_and_only_its_owner_can_read_it(tmp_path):
    path = tmp_path / "made" / "here" / "server.json"  # the folder is created
    record = _record(os.getpid())
    assert write_record(record, path) == path
    assert read_record(path) == record
    assert stat.S_IMODE(path.stat().st_mode) == 0o600  # it holds the token
    assert json.loads(path.read_text())["token"] == "s3cret"
    assert record.as_dict()["pid"] == os.getpid()
    assert sorted(p.name for p in path.parent.iterdir()) == ["server.json"]  # no temporary left


def test_writing_again_replaces_the_file_whole(tmp_path):
    path = tmp_path / "server.json"
    write_record(_record(os.getpid()), path)
    replacement = _record(os.getpid(), token=None)
    write_record(replacement, path)
    assert read_record(path) == replacement
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["server.json"]


def test_the_default_path_follows_mizuoto_home(tmp_path, monkeypatch):
    monkeypatch.setenv("MIZUOTO_HOME", str(tmp_path))
    record = _record(os.getpid())
    assert write_record(record) == tmp_path / "server.json"
    assert read_record() == record
    assert live_record() == (record, "")


@pytest.mark.parametrize(
    "text",
    ["{not json", "[]", '{"url": "http://127.0.0.1:7370"}', '{"pid": "many"}', ""],
    ids=["broken", "a list", "fields missing", "wrong types", "empty"],
)
def test_a_malformed_file_reads_as_no_record_and_says_so(tmp_path, caplog, text):
    path = tmp_path / "server.json"
    path.write_text(text)
    with caplog.at_level(logging.DEBUG):
        assert read_record(path) is None
    assert str(path) in caplog.text
    record, _ = live_record(path)
    assert record is None


def test_no_file_is_no_record_without_a_reason(tmp_path):
    assert read_record(tmp_path / "server.json") is None
    assert live_record(tmp_path / "server.json") == (None, "")


def test_a_dead_pid_is_a_stale_file_that_stays_for_the_next_server(tmp_path, dead_pid):
    assert pid_alive(os.getpid())
    assert not pid_alive(dead_pid)
    path = write_record(_record(dead_pid), tmp_path / "server.json")
    assert read_record(path) == _record(dead_pid)  # reading does not judge it
    record, why = live_record(path)
    assert record is None
    assert why == f"{path} names pid {dead_pid}, which is not running"
    assert path.exists()


def test_a_server_removes_only_its_own_file(tmp_path, dead_pid):
    path = write_record(_record(dead_pid), tmp_path / "server.json")
    assert remove_record(os.getpid(), path) is False  # another server's file: left alone
    assert read_record(path) == _record(dead_pid)
    assert remove_record(dead_pid, path) is True
    assert not path.exists()
    assert remove_record(dead_pid, path) is False  # nothing left to remove
