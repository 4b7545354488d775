"""RuntimeService: resident-model limit, pinning, settings, engine states."""

from __future__ import annotations

import threading

import pytest

from mizuoto_sdk import EngineError
from mizuoto_sdk.host import Discovery, EngineRequest, RuntimeService, Settings


def resident(service: RuntimeService) -> list[str]:
    return sorted(h.spec.model_id for h in service.models())


def test_make_room_unloads_the_least_recently_used_idle_model(host_engine):
    service = RuntimeService({"compute.max_resident_models": 2}, host_engine.discovery)
    a = service.load("hosted", "a")
    service.load("hosted", "b")
    list(a.synthesize("touch a"))  # b is now the least recently used
    service.load("hosted", "c")
    assert resident(service) == ["a", "c"]
    assert ("unload", "b") in host_engine.events


def test_a_busy_model_is_never_unloaded_to_make_room(host_engine):
    service = RuntimeService({"compute.max_resident_models": 1}, host_engine.discovery)
    a = service.load("hosted", "a")
    stream = a.synthesize("hello")
    next(stream)  # a is busy
    service.load("hosted", "b")
    assert resident(service) == ["a", "b"]
    stream.close()


def test_pinned_engines_stay_resident(host_engine):
    service = RuntimeService(
        {"compute.max_resident_models": 1, "engines.hosted.pinned": True}, host_engine.discovery
    )
    service.load("hosted", "a")
    service.load("hosted", "b")
    assert resident(service) == ["a", "b"]
    service.settings.set("engines.hosted.pinned", False)
    service.load("hosted", "c")
    assert resident(service) == ["c"]


def test_a_handle_unloaded_to_make_room_loads_again_when_its_call_begins(host_engine):
    service = RuntimeService({"compute.max_resident_models": 1}, host_engine.discovery)
    a = service.load("hosted", "a")
    stream = a.synthesize("asked for before b was loaded")
    assert service.load("hosted", "b").spec.model_id == "b"  # a was idle: unloaded for b
    assert resident(service) == ["b"]
    assert len(list(stream)) == 3
    assert resident(service) == ["a"]  # a came back for its call, and b made room for it
    assert len(list(service.load("hosted", "b").synthesize("b again"))) == 3
    assert len(list(a.synthesize("a again"))) == 3
    assert service.load("hosted", "a") is a  # still the one handle of that model


def test_threads_alternating_two_models_over_one_slot_never_see_an_unloaded_one(host_engine):
    service = RuntimeService({"compute.max_resident_models": 1}, host_engine.discovery)
    turns = [threading.Barrier(2) for _ in range(2)]
    errors: list[BaseException] = []

    def alternate(first: str, second: str) -> None:
        try:
            for round_ in range(20):
                model = first if round_ % 2 == 0 else second
                handle = service.load("hosted", model)
                turns[0].wait()  # both hold a handle; one of them was just unloaded by the other
                assert len(list(handle.synthesize("x", EngineRequest(params={"chunks": 1})))) == 1
                turns[1].wait()
        except BaseException as error:  # handed to the main thread
            errors.append(error)
            for barrier in turns:
                barrier.abort()

    threads = [threading.Thread(target=alternate, args=pair) for pair in (("a", "b"), ("b", "a"))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, repr(errors[0])


def test_loading_the_same_model_twice_returns_the_same_handle(host_engine):
    service = RuntimeService(discovery=host_engine.discovery)
    assert service.load("hosted", "a") is service.load("hosted", "a")
    assert service.load("hosted", "a", options={"x": 1}) is not service.load("hosted", "a")


def test_changing_an_engine_setting_unloads_it_and_the_next_request_reloads(host_engine):
    service = RuntimeService(discovery=host_engine.discovery)
    first = service.load("hosted", "a")
    service.settings.set("engines.hosted.options", {"voice": "x"})
    assert resident(service) == []
    second = service.load("hosted", "a")
    assert second is not first and second.spec.options == {"voice": "x"}
    service.settings.set("engines.hosted.options", {"voice": "x"})  # unchanged: stays loaded
    assert resident(service) == ["a"]


def test_a_setting_change_during_a_call_unloads_when_the_call_ends(host_engine):
    service = RuntimeService(discovery=host_engine.discovery)
    handle = service.load("hosted", "a")
    stream = handle.synthesize("hello")
    next(stream)
    service.settings.set("engines.hosted.model", "b")
    assert resident(service) == ["a"]
    stream.close()
    assert resident(service) == []
    assert service.load("hosted").spec.model_id == "b"


def test_states_follow_the_engine(host_engine):
    service = RuntimeService(discovery=host_engine.discovery)
    engine = service.engine("hosted")
    assert engine.state == "stopped"
    handle = engine.load("a")
    assert engine.state == "ready"
    stream = handle.synthesize("hi")
    next(stream)
    assert engine.state == "busy"
    stream.close()
    service.unload("hosted")
    assert engine.state == "stopped"
    assert service.describe_models() == []


def test_an_implementation_that_fails_to_import_crashes_the_engine(plugin_site):
    path = plugin_site("classes")  # engine raises-on-import: its module raises OSError
    service = RuntimeService(discovery=Discovery(path=path, selection=None))
    local = service.engine("raises-on-import")
    with pytest.raises(EngineError) as caught:
        local.load()
    assert caught.value.code == "engine_unavailable"
    assert local.state == "crashed" and "missing weights" in local.error


@pytest.mark.parametrize(
    ("key", "value", "field"),
    [
        ("compute.max_resident_models", 0, "compute.max_resident_models"),
        ("engines.x.dtype", "fp8", "engines.x.dtype"),
        ("engines.x.device", "gpu", "engines.x.device"),
        ("engines.x.pinned", "yes", "engines.x.pinned"),
        ("compute.nonsense", 1, "compute.nonsense"),
        ("compute.attention", "fastest", "compute.attention"),
        ("compute.kv_cache", "paged", "compute.kv_cache"),
        ("compute.compile", 1, "compute.compile"),
    ],
)
def test_bad_settings_are_typed_errors_naming_the_key(key, value, field):
    with pytest.raises(EngineError) as caught:
        Settings({key: value})
    assert caught.value.code == "invalid_request" and caught.value.detail["field"] == field
