"""Deployment plan: settings checked one by one when set, and together before any process starts."""

from __future__ import annotations

import math

import attrs
import pytest

from mizuoto_sdk.errors import InvalidRequest
from mizuoto_sdk.host import Settings
from mizuoto_sdk.host.sources import effective_settings
from mizuoto_sdk.serving.plan import (
    DEPLOYMENT_DEFAULTS,
    DEPLOYMENT_FIELDS,
    Deployment,
    plan_deployment,
)

CPU = ("cpu",)
ANY = ("cpu", "cuda", "mps", "xpu")

ACCEPTED = [
    ("replicas", 1, 1),
    ("replicas", 4, 4),
    ("devices", ["cpu", "cpu"], ("cpu", "cpu")),
    ("devices", ("cuda:0", "cuda:1"), ("cuda:0", "cuda:1")),
    ("devices", "cuda:1", ("cuda:1",)),
    ("devices", None, None),
    ("deployment", "auto", "auto"),
    ("deployment", "inline", "inline"),
    ("deployment", "local", "local"),
    ("deployment", "external", "external"),
    ("execution_timeout", 2, 2.0),
    ("execution_timeout", 0.25, 0.25),
    ("execution_timeout", None, None),
    ("restart", "never", "never"),
    ("restart", "on_failure", "on_failure"),
    ("threads", 1, 1),
    ("threads", 8, 8),
    ("threads", None, None),
]

REFUSED = [
    ("replicas", 0, ">= 1"),
    ("replicas", -1, ">= 1"),
    ("replicas", True, ">= 1"),
    ("replicas", 1.0, ">= 1"),
    ("replicas", "2", ">= 1"),
    ("replicas", None, ">= 1"),
    ("devices", [], "non-empty list"),
    ("devices", 3, "non-empty list"),
    ("devices", {"cpu": 1}, "non-empty list"),
    ("devices", ["cpu", "gpu"], "'gpu' is not a device"),
    ("devices", ["cuda:"], "not a device"),
    ("devices", ["cpu", 0], "expected a string"),
    ("deployment", "remote", "auto, inline, local, external"),
    ("deployment", None, "auto, inline, local, external"),
    ("execution_timeout", 0, "finite number of seconds > 0"),
    ("execution_timeout", -1.5, "finite number of seconds > 0"),
    ("execution_timeout", math.inf, "finite number of seconds > 0"),
    ("execution_timeout", math.nan, "finite number of seconds > 0"),
    ("execution_timeout", 10**400, "finite number of seconds > 0"),
    ("execution_timeout", True, "finite number of seconds > 0"),
    ("execution_timeout", "5", "finite number of seconds > 0"),
    ("restart", "always", "never, on_failure"),
    ("restart", False, "never, on_failure"),
    ("threads", 0, ">= 1"),
    ("threads", True, ">= 1"),
    ("threads", 2.5, ">= 1"),
]


@pytest.mark.parametrize(("field", "value", "stored"), ACCEPTED)
def test_a_valid_deployment_setting_is_stored(field, value, stored):
    assert DEPLOYMENT_FIELDS[field](f"engines.x.{field}", value) == stored


@pytest.mark.parametrize(("field", "value", "expected"), REFUSED)
def test_a_bad_deployment_setting_names_its_key_and_what_was_expected(field, value, expected):
    key = f"engines.x.{field}"
    with pytest.raises(InvalidRequest) as caught:
        DEPLOYMENT_FIELDS[field](key, value)
    assert caught.value.detail["field"] == key
    assert str(caught.value).startswith(f"{key}: ")
    assert expected in str(caught.value)


def test_every_field_has_a_default():
    assert set(DEPLOYMENT_DEFAULTS) == set(DEPLOYMENT_FIELDS)


def plan(fields=None, devices=CPU, device=None, engine="x"):
    return plan_deployment(engine, fields or {}, devices, device)


def refused(fields, devices=CPU, device=None):
    with pytest.raises(InvalidRequest) as caught:
        plan(fields, devices, device)
    return caught.value


def test_the_defaults_run_one_replica_inline_on_cpu():
    deployment = plan()
    assert deployment == Deployment(
        engine_id="x", mode="inline", replicas=(("cpu",),), execution_timeout=None,
        restart="never", threads=None,
    )  # fmt: skip
    assert deployment.ranks == 1


def test_none_takes_the_default_and_other_engine_fields_are_ignored():
    fields = {f: None for f in DEPLOYMENT_FIELDS} | {"dtype": "float32", "pinned": True}
    assert plan(fields) == plan()


@pytest.mark.parametrize(
    ("fields", "replicas"),
    [
        ({"replicas": 2}, (("cpu",), ("cpu",))),
        ({"devices": ["cpu"]}, (("cpu",),)),
        ({"devices": ["cuda:1", "cuda:0"], "replicas": 2}, (("cuda:1",), ("cuda:0",))),
    ],
)
def test_auto_runs_local_for_more_replicas_or_explicit_devices(fields, replicas):
    deployment = plan(fields, devices=ANY)
    assert deployment.mode == "local"
    assert deployment.replicas == replicas
    assert deployment.ranks == 1


def test_the_device_argument_serves_every_replica_when_devices_is_unset():
    deployment = plan({"replicas": 3, "deployment": "local"}, devices=("cuda",), device="cuda:1")
    assert deployment.replicas == (("cuda:1",), ("cuda:1",), ("cuda:1",))


def test_listed_devices_win_over_the_device_argument():
    deployment = plan({"devices": ["cpu"]}, devices=ANY, device="cuda:0")
    assert deployment.replicas == (("cpu",),)


def test_settings_are_carried_into_the_plan():
    deployment = plan(
        {"replicas": 2, "execution_timeout": 3, "restart": "on_failure", "threads": 1}
    )
    assert (deployment.execution_timeout, deployment.restart, deployment.threads) == (
        3.0,
        "on_failure",
        1,
    )


def test_a_device_count_that_does_not_match_the_replicas_names_the_fix():
    error = refused({"replicas": 2, "devices": ["cpu", "cpu", "cpu"]})
    assert error.detail["field"] == "engines.x.devices"
    assert str(error).startswith(
        "engines.x.devices lists 3 devices; 2 replicas of 1 rank need 2, one per rank of every "
        "replica"
    )
    assert "engines.x.replicas = 3" in str(error)
    error = refused({"devices": ["cpu", "cpu"], "deployment": "local"})
    assert "1 replica of 1 rank needs 1" in str(error)


def test_a_device_type_the_engine_does_not_support_is_refused():
    error = refused({"devices": ["cpu", "cuda:0"], "replicas": 2})
    assert error.detail["field"] == "engines.x.devices"
    assert "runs on cpu, not 'cuda:0'" in str(error)
    error = refused({}, device="cuda")
    assert error.detail["field"] == "device"
    assert "engines.x.device" in str(error)


def test_a_bad_value_given_straight_to_the_plan_names_its_key():
    error = refused({"replicas": 0})
    assert error.detail["field"] == "engines.x.replicas"


@pytest.mark.parametrize(
    "fields", [{"replicas": 2}, {"devices": ["cpu", "cpu"]}, {"replicas": 2, "devices": "cpu"}]
)
def test_inline_with_more_than_one_replica_or_device_names_local_as_the_fix(fields):
    error = refused({**fields, "deployment": "inline"})
    assert error.detail["field"] == "engines.x.deployment"
    assert 'engines.x.deployment = "local"' in str(error)


def test_inline_with_one_listed_device_runs_on_it():
    deployment = plan({"deployment": "inline", "devices": ["cuda:1"]}, devices=ANY)
    assert (deployment.mode, deployment.replicas) == ("inline", (("cuda:1",),))


def test_local_with_one_replica_runs_one_worker():
    deployment = plan({"deployment": "local"})
    assert (deployment.mode, deployment.replicas) == ("local", (("cpu",),))


def test_external_is_one_replica_on_the_engine_device():
    deployment = plan({"deployment": "external"})
    assert (deployment.mode, deployment.replicas) == ("external", (("cpu",),))


def test_a_deployment_value_is_frozen_and_checks_its_replicas():
    deployment = plan({"replicas": 2})
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        deployment.mode = "inline"  # type: ignore[misc]  # assigning to a frozen field is the point
    with pytest.raises(ValueError, match="replicas"):
        Deployment(engine_id="x", mode="local", replicas=())
    with pytest.raises(ValueError, match="replicas"):
        Deployment(engine_id="x", mode="local", replicas=(("cpu",), ("cpu", "cpu")))


def test_settings_refuse_a_bad_deployment_value_when_set():
    with pytest.raises(InvalidRequest) as caught:
        Settings({"engines.x.replicas": 0})
    assert caught.value.detail["field"] == "engines.x.replicas"
    settings = Settings()
    with pytest.raises(InvalidRequest, match=r"engines\.x\.restart: "):
        settings.set("engines.x.restart", "always")
    assert settings.engine("x", "restart") is None


def test_settings_leave_deployment_keys_unset_so_the_plan_takes_the_defaults():
    settings = Settings()
    fields = {f: settings.engine("x", f) for f in DEPLOYMENT_FIELDS}
    assert set(fields.values()) == {None}
    assert plan(fields) == plan()


def test_set_overrides_parse_deployment_values(tmp_path):
    settings, origin = effective_settings(
        [
            "engines.codeclm.replicas=2",
            'engines.codeclm.devices=["cpu", "cpu"]',
            "engines.codeclm.execution_timeout=1.5",
            "engines.codeclm.restart=on_failure",
        ],
        user_file=tmp_path / "none.toml",
        environ={},
    )
    fields = {f: settings.engine("codeclm", f) for f in DEPLOYMENT_FIELDS}
    assert fields["devices"] == ("cpu", "cpu")
    assert origin["engines.codeclm.replicas"] == "--set"
    deployment = plan_deployment("codeclm", fields, CPU)
    assert deployment.mode == "local"
    assert deployment.replicas == (("cpu",), ("cpu",))
    assert (deployment.execution_timeout, deployment.restart) == (1.5, "on_failure")


def test_a_settings_file_sets_deployment_keys(tmp_path):
    path = tmp_path / "settings.toml"
    path.write_text("[engines.sine]\nreplicas = 2\nthreads = 0\n", encoding="utf-8")
    with pytest.raises(InvalidRequest) as caught:
        effective_settings(user_file=path, environ={})
    assert caught.value.detail["field"] == "engines.sine.threads"
    assert f"{path}:3: engines.sine.threads: " in str(caught.value)
