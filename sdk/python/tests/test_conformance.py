"""Every scenario of `sdk/conformance/scenarios`, through the blocking and the asyncio library."""

from __future__ import annotations

from typing import Optional

import pytest

from conformance import SCENARIOS, run_scenario, scenario_names


def test_the_scenarios_are_there() -> None:
    assert SCENARIOS.is_dir(), f"{SCENARIOS} is missing"
    assert len(scenario_names()) >= 11


@pytest.mark.parametrize("mode", ["blocking", "asyncio"])
@pytest.mark.parametrize("name", scenario_names())
def test_scenario(name: str, mode: str, url: str, key: Optional[str]) -> None:
    run_scenario(name, url, key, mode)
