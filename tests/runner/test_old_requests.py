"""A data directory outlives an upgrade: a response whose request the code before issue
37 stored (tests/protocol/old_requests.json) is shown as that code showed it, and its
task runs as it ran then (the test engine writes the same words from the same prompt and
seed), on either store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.protocol.request import from_stored
from lmsp.protocol.states import Status
from lmsp.store import responses
from lmsp.store import tasks as task_store

OLD = json.loads((Path(__file__).parent.parent / "protocol" / "old_requests.json").read_text())


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "sqlite":
        return settings
    return settings.with_overrides(database_url=request.getfixturevalue("pg_url"))


def with_old_request(svc: Service, name: str) -> str:
    """A queued task whose response row holds the request as the earlier code wrote it."""
    owner = svc.db.reader().execute(
        "SELECT value FROM service_config WHERE key = 'owner_client_id'"
    )
    client_id = str(owner.fetchone()[0])

    def job(conn: Any) -> responses.Created:
        created = responses.create(
            conn,
            client_id=client_id,
            request=from_stored({"model": "lmsp-test", "input": "x", "background": True}),
            on_restart="fail",
            max_queue=100,
            key=None,
        )
        conn.execute(
            "UPDATE responses SET request = ? WHERE id = ?",
            (OLD["rows"][name], created.response_id),
        )
        return created

    return svc.db.write_sync(job).task_id


@pytest.mark.parametrize("name", sorted(OLD["shown"]))
def test_an_earlier_request_is_shown_as_it_was(svc: Service, name: str) -> None:
    task_id = with_old_request(svc, name)
    shown = svc.response_object(task_id)
    assert {field: shown[field] for field in OLD["shown"][name]} == OLD["shown"][name]


@pytest.mark.parametrize("name", sorted(OLD["written"]))
def test_an_earlier_request_runs_as_it_ran(svc: Service, name: str) -> None:
    task_id = with_old_request(svc, name)
    assert svc.runner.run_next() == task_id
    task = task_store.get(svc.db.reader(), task_id)
    assert task is not None and task.status is Status.COMPLETED
    shown = svc.response_object(task_id)
    assert shown["status"] == "incomplete"  # its max_output_tokens (3) ran out, as then
    text, input_tokens, output_tokens = OLD["written"][name]
    assert shown["output"][0]["content"][0]["text"] == text
    assert (shown["usage"]["input_tokens"], shown["usage"]["output_tokens"]) == (
        input_tokens,
        output_tokens,
    )
