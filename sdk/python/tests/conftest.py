"""Fixtures: the live coordinator the tests run against (`RUNLEASE_URL`, `RUNLEASE_KEY`).

No coordinator, no tests: a missing `RUNLEASE_URL` fails every test that needs it.
"""

from __future__ import annotations

import os
import uuid
from typing import Optional

import httpx
import pytest


@pytest.fixture(scope="session")
def url() -> str:
    value = os.environ.get("RUNLEASE_URL")
    if not value:
        pytest.fail("RUNLEASE_URL must name a live coordinator (see README: Tests)")
    try:
        httpx.get(value.rstrip("/") + "/healthz", timeout=5).raise_for_status()
    except httpx.HTTPError as e:
        pytest.fail(f"the coordinator at RUNLEASE_URL={value} does not answer: {e}")
    return value


@pytest.fixture(scope="session")
def key() -> Optional[str]:
    """An admin key, or None in open mode."""
    return os.environ.get("RUNLEASE_KEY") or None


@pytest.fixture
def queue() -> str:
    """A queue of the test's own."""
    return f"pytest-{uuid.uuid4().hex[:12]}"
