"""Parallel domains: what a manifest declares, and a topology refused before any worker starts."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

from mizuoto_sdk import (
    Engine,
    EngineManifest,
    InvalidRequest,
    ModelEntry,
    ParallelConfig,
    hookimpl,
)
from mizuoto_sdk.cli import main
from mizuoto_sdk.host import Discovery, RuntimeService
from mizuoto_sdk.parallel import check_declared

HEADS = 4


class NarrowEngine(Engine):
    """Splits attention heads only, and only over a divisor of its head count."""

    @classmethod
    def validate_parallel(cls, parallel: ParallelConfig, replica_world_size: int) -> None:
        tp = parallel.resolved("attention").tp_size
        if HEADS % tp:
            raise InvalidRequest(
                f"engines.narrow.parallel.attention.tp_size: {HEADS} heads do not split over "
                f"{tp} ranks; use a divisor of {HEADS}",
                {"field": "engines.narrow.parallel"},
            )


def manifest(engine_id: str, domains: tuple[str, ...] = ()) -> EngineManifest:
    return EngineManifest(
        id=engine_id,
        implementation=f"{__name__}:NarrowEngine",
        models=[ModelEntry("a")],
        capabilities=["synthesize"],
        parallel_domains=domains,
    )


def service(settings: dict[str, object]) -> RuntimeService:
    plugin = SimpleNamespace(
        mizuoto_engines=hookimpl(
            lambda: [manifest("narrow", ("attention", "dense")), manifest("single")]
        )
    )
    discovery = Discovery(plugins={"narrow-dist": plugin}, entry_points=False)
    return RuntimeService(settings, discovery)


def test_a_manifest_declares_known_domains_once():
    assert manifest("x", ("dense", "attention")).parallel_domains == ("dense", "attention")
    assert manifest("x").parallel_domains == ()
    with pytest.raises(ValueError, match=r"parallel_domains: unknown.*expected some of pipeline"):
        manifest("x", ("tensor",))
    with pytest.raises(ValueError, match="lists a value twice"):
        manifest("x", ("dense", "dense"))


def test_check_declared_names_the_undeclared_domain_and_the_fix():
    config = ParallelConfig.from_mapping({"dense": {"tp_size": 2}, "outer": {"cfg_size": 2}})
    check_declared(manifest("x", ("dense", "cfg")), config)
    with pytest.raises(InvalidRequest) as caught:
        check_declared(manifest("x", ("dense",)), config)
    assert caught.value.detail == {
        "field": "engines.x.parallel",
        "engine": "x",
        "undeclared": ["cfg"],
    }
    assert "splits cfg over 4 ranks" in str(caught.value)
    assert "remove engines.x.parallel.outer.cfg_size" in str(caught.value)
    with pytest.raises(InvalidRequest, match=r"declares no parallel domains.*replicas"):
        check_declared(manifest("x"), config)


def test_a_replicated_domain_needs_no_declaration():
    check_declared(manifest("x"), ParallelConfig.from_mapping({"dense": {"tp_size": 1}}))


def test_an_undeclared_domain_is_refused_before_any_worker_starts():
    with pytest.raises(InvalidRequest, match="engine 'single' declares no parallel domains"):
        service({"engines.single.parallel.dense.tp_size": 2}).deployment("single")


def test_the_engine_class_tightens_what_its_manifest_declares():
    with pytest.raises(InvalidRequest, match="4 heads do not split over 3 ranks") as caught:
        service({"engines.narrow.parallel.attention.tp_size": 3}).deployment("narrow")
    assert caught.value.detail["field"] == "engines.narrow.parallel"
    deployment = service({"engines.narrow.parallel.attention.tp_size": 2}).deployment("narrow")
    assert (deployment.mode, deployment.ranks) == ("local", 2)


def test_the_default_validate_parallel_accepts_what_is_declared():
    Engine.validate_parallel(ParallelConfig.from_mapping({"moe": {"ep_size": 2}}), 2)


def test_engines_json_lists_the_domains(capsys):
    assert main(["engines", "--json"]) == 0
    rows = {row["id"]: row for row in json.loads(capsys.readouterr().out)}
    assert rows["codeclm"]["parallel_domains"] == ["dense", "attention"]
    assert rows["sine"]["parallel_domains"] == []


def test_engines_text_lists_the_domains_in_a_real_process():
    done = subprocess.run(
        [sys.executable, "-m", "mizuoto_sdk.cli", "engines"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "codeclm: splits across ranks: dense, attention" in done.stdout
