"""The fresh process (``mizuoto_contract.isolated``) keeps the engine to folders of its own, adopts
its orphans, and names what it finds left: the file, the pid, the socket, the holder."""

from __future__ import annotations

import importlib
import os
import re
import sys
from pathlib import Path

import pytest

from mizuoto_contract import run_contract
from mizuoto_sdk.host import Discovery

CORPUS = Path(__file__).resolve().parent / "corpus"
linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc (Linux)")


@pytest.fixture
def corpus(monkeypatch: pytest.MonkeyPatch) -> Discovery:
    monkeypatch.syspath_prepend(str(CORPUS))
    monkeypatch.delenv("MIZUOTO_PLUGINS", raising=False)
    return Discovery()


def _failure(engine: str, check: str, corpus: Discovery) -> str:
    """The message of ``check``, run alone (so the engine runs only in the fresh process)."""
    [result] = run_contract(engine, discovery=corpus, checks=[check])
    assert result.status == "failed", result.message
    return result.message


def test_files_written_into_home_stay_in_the_runs_own_home(corpus):
    cache = Path.home() / ".cache" / "mizuoto-broken-notes"
    message = _failure("broken-resources-no_temp_files--home", "resources.no_temp_files", corpus)
    assert "unload: ~/.cache/mizuoto-broken-notes/notes.txt (HOME)" in message
    assert not cache.exists()  # the user's own HOME was never written


def test_files_written_into_the_working_folder_stay_in_the_runs_own_folder(corpus):
    message = _failure("broken-resources-no_temp_files--cwd", "resources.no_temp_files", corpus)
    assert "mizuoto-broken-last-spoken.txt (the working folder)" in message
    assert not Path("mizuoto-broken-last-spoken.txt").exists()


@linux
def test_a_socket_left_open_is_named_by_its_address(corpus):
    message = _failure("broken-resources-no_temp_files--socket", "resources.no_temp_files", corpus)
    assert re.search(r"second call: tcp socket listening on 127\.0\.0\.1:\d+", message), message


@linux
def test_a_daemonised_helper_is_found_and_ended_by_pid(corpus):
    message = _failure("broken-resources-no_processes--daemon", "resources.no_processes", corpus)
    pids = [int(pid) for pid in re.findall(r"pid (\d+) \(sleep\)", message)]
    assert pids, message
    assert not [pid for pid in pids if os.path.exists(f"/proc/{pid}")]


def test_a_thread_started_at_import_is_found(corpus):
    message = _failure("broken-resources-no_threads--import", "resources.no_threads", corpus)
    assert "thread 'mizuoto-broken-cache-warmer' (running since the import)" in message


def test_weights_kept_in_a_module_global_are_found_with_their_holder(corpus):
    try:
        message = _failure(
            "broken-resources-unload_releases--weights", "resources.unload_releases", corpus
        )
    finally:  # the check loads here too, filling this process's cache
        importlib.import_module("mizuoto_broken.resources_unload_releases__weights").restore()
    assert "tensor storage(s) not freed" in message
    assert "mizuoto_broken.resources_unload_releases__weights._CHECKPOINTS" in message


def test_a_module_inside_a_helper_object_is_named_by_its_path(corpus):
    message = _failure("broken-load-handles_declared--helper", "load.handles_declared", corpus)
    assert "observed not listed: smoother.layer (Identity)\n" in message, message


def test_a_change_at_import_names_the_module_being_imported_and_its_importer(corpus):
    message = _failure("broken-load-global_state--dependency", "load.global_state", corpus)
    assert "during the import of chatty_dependency" in message, message
    assert "imported by mizuoto_broken.load_global_state__dependency" in message


def test_a_change_in_load_names_the_line_of_the_engines_code(corpus):
    message = _failure("broken-load-global_state--numpy_draw", "load.global_state", corpus)
    assert re.search(r"at \S*load_global_state__numpy_draw\.py:\d+ in \S*load", message), message
