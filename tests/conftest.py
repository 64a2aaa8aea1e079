"""Shared fixtures: settings on a temporary data directory and an in-process client."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.config import Settings


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(data_dir=tmp_path / "data", enable_test_engine=True, gc_interval=3600)


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The real app with its lifespan (bootstrap, recovery, runner), in process."""
    with TestClient(create_app(settings)) as test_client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client
