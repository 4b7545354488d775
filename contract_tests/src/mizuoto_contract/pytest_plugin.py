"""pytest plugin (entry point ``pytest11``): one option and one fixture, nothing imported.

It does nothing unless a test uses ``parametrize_contract`` or the ``mizuoto_device`` fixture.
"""

from __future__ import annotations

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mizuoto-contract")
    group.addoption(
        "--mizuoto-device",
        default=None,
        help="device for Mizuoto contract checks (default: each case's own, cpu)",
    )


@pytest.fixture
def mizuoto_device(request: pytest.FixtureRequest) -> str | None:
    """The --mizuoto-device option, for ``contract_case.run(device=...)``."""
    return request.config.getoption("--mizuoto-device")
