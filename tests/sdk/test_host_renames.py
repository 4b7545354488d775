"""The host's names from the previous release still work for one release, and warn."""

from __future__ import annotations

import pytest

import mizuoto_sdk.host
from mizuoto_sdk.host import LocalModel, RuntimeService


@pytest.fixture
def service():
    return RuntimeService()


def test_local_handle_is_local_model_with_a_warning():
    with pytest.warns(DeprecationWarning, match="LocalModel"):
        assert mizuoto_sdk.host.LocalHandle is LocalModel
    with pytest.warns(DeprecationWarning, match="LocalModel"):
        from mizuoto_sdk.host.local import LocalHandle
    assert LocalHandle is LocalModel


def test_old_service_methods_answer_as_the_new_ones(service):
    with pytest.warns(DeprecationWarning, match="use load"):
        model = service.loaded("sine")
    assert model is service.load("sine")
    with pytest.warns(DeprecationWarning, match="use models"):
        assert service.handles() == service.models() == [model]
    with pytest.warns(DeprecationWarning, match="use describe_models"):
        assert service.loaded_models() == service.describe_models()
    assert [row["name"] for row in service.describe_models()] == [model.name]


def test_old_model_and_engine_attributes_answer_as_the_new_ones(service):
    model = service.load("sine")
    with pytest.warns(DeprecationWarning, match="loaded_engine"):
        assert model.loaded is model.loaded_engine is not None
    with pytest.warns(DeprecationWarning, match="model_handles"):
        assert model.handles == model.model_handles
    with pytest.warns(DeprecationWarning, match="use models"):
        assert model.engine.handles == model.engine.models == [model]
    with pytest.warns(DeprecationWarning, match="use host"):
        assert model.engine.service is service
