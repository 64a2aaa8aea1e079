"""``lmsp doctor`` and ``lmsp ps`` on a PostgreSQL database nodes share."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.cli import main
from lmsp.cli.ps import render
from lmsp.config import Settings
from tests.helpers import free_port


@pytest.fixture
def pg_settings(settings: Settings, pg_url: str) -> Settings:
    return settings.with_overrides(database_url=pg_url, node_id="node-1")


@pytest.fixture
def pg_client(pg_settings: Settings) -> Iterator[TestClient]:
    with TestClient(create_app(pg_settings)) as test_client:
        token = (pg_settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


def test_doctor_checks_the_database_and_the_clock_skew(
    pg_client: TestClient, pg_settings: Settings
) -> None:
    env = {
        "LMSP_DATA_DIR": str(pg_settings.data_dir),
        "LMSP_DATABASE_URL": str(pg_settings.database_url),
        "LMSP_URL": f"http://127.0.0.1:{free_port()}",
    }
    result = CliRunner().invoke(main, ["doctor", "--json"], env=env)
    assert result.exit_code == 0, result.output
    checks = {c["name"]: c for c in json.loads(result.stdout)["checks"]}
    assert checks["database connection"]["status"] == "ok"
    assert checks["database connection"]["detail"].startswith("PostgreSQL ")
    assert checks["schema version"]["status"] == "ok"
    assert checks["clock skew"]["status"] == "ok"
    assert "from this machine's" in checks["clock skew"]["detail"]
    assert checks["nodes"]["status"] == "ok" and "node-1 up" in checks["nodes"]["detail"]
    clocks = checks["nodes' clocks"]  # each node's, measured when it joined or renewed
    assert clocks["status"] == "ok" and clocks["detail"].startswith("node-1 ")
    assert checks["owner token file"]["status"] == "ok"
    assert checks["model lmsp-test"]["status"] == "ok"
    unreachable = dict(env, LMSP_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none")
    down = CliRunner().invoke(main, ["doctor", "--json"], env=unreachable)
    assert down.exit_code == 1
    failed = [c for c in json.loads(down.stdout)["checks"] if c["status"] == "fail"]
    assert failed[0]["name"] == "database connection"


def test_activity_and_ps_show_the_nodes(pg_client: TestClient) -> None:
    state = pg_client.get("/v1/service/activity").json()
    assert state["node"] == "node-1"
    [node] = state["nodes"]
    assert node["id"] == "node-1" and node["status"] == "up" and node["epoch"] == 1
    assert node["lease_seconds_left"] > 0 and node["unfinished"] == 0 and node["tasks"] == []
    assert abs(node["clock_skew_seconds"]) < 1  # one machine: the database's clock is ours
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(render(state))
    shown = console.export_text()
    assert "Nodes" in shown and "node-1 (this node)" in shown and "SKEW" in shown
