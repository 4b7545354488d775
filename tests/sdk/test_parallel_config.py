"""ParallelConfig: the rank layout it implies, its rule, and how settings and the plan read it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mizuoto_sdk import (
    AttentionParallelConfig,
    DenseParallelConfig,
    InvalidRequest,
    MoeParallelConfig,
    OuterParallelConfig,
    ParallelConfig,
)
from mizuoto_sdk.host import Settings
from mizuoto_sdk.host.sources import effective_settings
from mizuoto_sdk.parallel import GROUP_NAMES
from mizuoto_sdk.serving.plan import plan_deployment

SIZES = st.integers(min_value=1, max_value=3)


@st.composite
def configs(draw: st.DrawFn) -> ParallelConfig:
    """A valid config: every given domain's sizes multiply to the same scope."""
    tp, cp_or_ep, dp = draw(SIZES), draw(SIZES), draw(SIZES)
    scope = tp * cp_or_ep * dp
    dense = DenseParallelConfig(tp_size=tp * cp_or_ep, dp_size=dp)
    attention = AttentionParallelConfig(tp_size=tp, cp_size=cp_or_ep, dp_size=dp)
    moe = MoeParallelConfig(tp_size=dp, ep_size=cp_or_ep, dp_size=tp)
    given_ = draw(st.sets(st.sampled_from(["dense", "attention", "moe"])))
    parts = {"dense": dense, "attention": attention, "moe": moe}
    config = ParallelConfig(
        outer=OuterParallelConfig(pipeline_size=draw(SIZES), cfg_size=draw(SIZES)),
        **{name: parts[name] for name in given_},
    )
    assert config.scope == (scope if given_ else 1)
    return config


def group_size(config: ParallelConfig, name: str) -> int:
    if name == "world":
        return config.ranks
    if name in ("pipeline", "cfg"):
        return getattr(config.outer, f"{name}_size")
    domain, axis = name.split("_")
    return getattr(config.resolved(domain), f"{axis}_size")


@given(configs())
def test_each_names_groups_partition_the_ranks_in_the_sizes_the_config_says(config):
    layout = config.layout()
    assert tuple(layout) == GROUP_NAMES
    for name, groups in layout.items():
        members = sorted(rank for group in groups for rank in group)
        assert members == list(range(config.ranks)), name
        assert {len(group) for group in groups} == {group_size(config, name)}, name
        assert all(list(group) == sorted(group) for group in groups)
    assert layout["world"] == (tuple(range(config.ranks)),)


@given(configs())
def test_tensor_parallel_groups_are_runs_of_neighbouring_ranks(config):
    for name in ("dense_tp", "attention_tp", "moe_tp"):
        for group in config.layout()[name]:
            assert list(group) == list(range(group[0], group[0] + len(group)))


@given(configs())
def test_groups_of_two_names_in_one_domain_meet_in_one_rank(config):
    layout = config.layout()
    for first, second in [("dense_tp", "dense_dp"), ("attention_tp", "attention_cp")]:
        for a in layout[first]:
            for b in layout[second]:
                assert len(set(a) & set(b)) <= 1
    for a in layout["pipeline"]:
        for b in layout["cfg"]:
            assert len(set(a) & set(b)) <= 1


@given(configs())
def test_a_config_survives_its_mapping(config):
    assert ParallelConfig.from_mapping(config.as_mapping()) == config


def test_ranks_are_the_outer_sizes_times_the_scope():
    config = ParallelConfig(
        outer=OuterParallelConfig(pipeline_size=2, cfg_size=3),
        dense=DenseParallelConfig(tp_size=2, dp_size=2),
    )
    assert (config.scope, config.ranks) == (4, 24)
    assert config.split_domains == {"pipeline", "cfg", "dense"}
    assert config.resolved("attention") == AttentionParallelConfig(tp_size=4)
    assert ParallelConfig().ranks == 1 and ParallelConfig().split_domains == frozenset()


def test_domains_covering_different_ranks_are_refused_naming_the_rule_and_numbers():
    with pytest.raises(InvalidRequest) as caught:
        ParallelConfig.from_mapping(
            {"dense": {"tp_size": 2}, "attention": {"tp_size": 2, "cp_size": 2}},
            "engines.x.parallel",
        )
    message = str(caught.value)
    assert caught.value.detail["field"] == "engines.x.parallel"
    assert "dense.tp_size*dense.dp_size = attention.tp_size*attention.cp_size" in message
    assert "dense covers 2*1 = 2" in message and "attention covers 2*2*1 = 4" in message
    assert "change the sizes" in message


@pytest.mark.parametrize("size", [0, -1, True, 1.5, "2"])
def test_a_size_that_is_not_a_whole_number_is_refused(size):
    with pytest.raises(InvalidRequest, match="expected a whole number >= 1"):
        DenseParallelConfig(tp_size=size)
    with pytest.raises(InvalidRequest) as caught:
        ParallelConfig.from_mapping({"moe": {"ep_size": size}}, "engines.x.parallel")
    assert caught.value.detail["field"] == "engines.x.parallel.moe.ep_size"


@pytest.mark.parametrize(
    ("value", "field", "says"),
    [
        ({"mlp": {"tp_size": 2}}, "engines.x.parallel.mlp", "unknown parallel domain"),
        ({"dense": {"cp_size": 2}}, "engines.x.parallel.dense.cp_size", "tp_size, dp_size"),
        ({"dense": 2}, "engines.x.parallel.dense", "expected a table of sizes"),
        ([2], "engines.x.parallel", "expected a table"),
    ],
)
def test_from_mapping_names_the_wrong_key(value, field, says):
    with pytest.raises(InvalidRequest, match=says) as caught:
        ParallelConfig.from_mapping(value, "engines.x.parallel")
    assert caught.value.detail["field"] == field
    assert str(caught.value).startswith(field)


def test_dotted_settings_keys_merge_into_the_engines_mapping():
    settings = Settings({"engines.x.parallel.dense.tp_size": 2})
    heard = []
    settings.subscribe(lambda key, value: heard.append(key))
    settings.set("engines.x.parallel.attention", {"tp_size": 2})
    config = ParallelConfig.from_mapping(settings.engine("x", "parallel"))
    assert config.dense == DenseParallelConfig(tp_size=2)
    assert config.attention == AttentionParallelConfig(tp_size=2)
    assert heard == ["engines.x.parallel"]
    with pytest.raises(InvalidRequest, match="dense covers 2"):
        settings.set("engines.x.parallel.moe.ep_size", 4)
    assert ParallelConfig.from_mapping(settings.engine("x", "parallel")) == config


def test_the_mapping_form_replaces_and_is_checked():
    settings = Settings()
    settings.set("engines.x.parallel", {"outer": {"cfg_size": 2}})
    assert ParallelConfig.from_mapping(settings.engine("x", "parallel")).ranks == 2
    with pytest.raises(InvalidRequest) as caught:
        settings.set("engines.x.parallel", {"dense": {"tp_size": 0}})
    assert caught.value.detail["field"] == "engines.x.parallel.dense.tp_size"


def test_set_and_a_settings_file_table_reach_the_same_config(tmp_path):
    file = tmp_path / "settings.toml"
    file.write_text("[engines.codeclm.parallel.dense]\ntp_size = 2\n")
    settings, origin = effective_settings(
        ["engines.codeclm.parallel.attention.tp_size=2"], user_file=file, environ={}
    )
    config = ParallelConfig.from_mapping(settings.engine("codeclm", "parallel"))
    assert (config.dense.tp_size, config.attention.tp_size, config.ranks) == (2, 2, 2)
    assert origin["engines.codeclm.parallel"] == "--set"
    file.write_text("[engines.codeclm.parallel.dense]\ntp_size = 0\n")
    with pytest.raises(InvalidRequest, match=r"settings\.toml:2: .*dense\.tp_size"):
        effective_settings([], user_file=file, environ={})


def two_ranks() -> ParallelConfig:
    return ParallelConfig(dense=DenseParallelConfig(tp_size=2))


def test_the_plan_needs_one_device_per_rank_of_every_replica():
    deployment = plan_deployment(
        "x",
        {"replicas": 2, "devices": ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]},
        ("cuda",),
        parallel=two_ranks(),
    )
    assert deployment.replicas == (("cuda:0", "cuda:1"), ("cuda:2", "cuda:3"))
    assert (deployment.mode, deployment.ranks, deployment.parallel) == ("local", 2, two_ranks())
    with pytest.raises(InvalidRequest) as caught:
        plan_deployment(
            "x", {"replicas": 2, "devices": ["cuda:0"] * 3}, ("cuda",), None, two_ranks()
        )
    message = str(caught.value)
    assert caught.value.detail["field"] == "engines.x.devices"
    assert "2 replicas of 2 ranks need 4" in message and "list 4" in message


def test_several_ranks_run_as_workers_and_inline_is_refused():
    deployment = plan_deployment("x", {}, ("cpu",), "cpu", two_ranks())
    assert (deployment.mode, deployment.replicas) == ("local", (("cpu", "cpu"),))
    with pytest.raises(InvalidRequest, match="2 ranks per replica") as caught:
        plan_deployment("x", {"deployment": "inline"}, ("cpu",), "cpu", two_ranks())
    assert caught.value.detail["field"] == "engines.x.deployment"


def test_external_is_one_replica_whatever_the_process_count():
    deployment = plan_deployment("x", {"deployment": "external"}, ("cpu",), "cpu", two_ranks())
    assert (deployment.mode, deployment.replicas) == ("external", (("cpu", "cpu"),))
    listed = plan_deployment(
        "x", {"deployment": "external", "devices": ["cuda:0"]}, ("cuda",), None, two_ranks()
    )
    assert listed.replicas == (("cuda:0",),)
    with pytest.raises(InvalidRequest, match="replicas = 1"):
        plan_deployment("x", {"deployment": "external", "replicas": 2}, ("cpu",))
