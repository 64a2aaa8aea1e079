"""A structured-output task survives ``kill -9``: its matcher is rebuilt and fed the
snapshot's tokens, so the resumed output is byte-identical to an uninterrupted run with
the same seed, valid against its schema, and its log is gap-free with one terminal."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from jsonschema import validate

from tests.helpers import Server, check_log_invariants, open_db, task_log
from tests.test_resume import kill_mid_task, text_of, wait_for_events

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 30},
        "story": {"type": "string", "maxLength": 400},
        "moral": {"enum": ["patience", "courage", "kindness"]},
    },
    "required": ["title", "story", "moral"],
    "additionalProperties": False,
}
BODY = {
    "model": "smollm2-135m-instruct",
    "input": "Write a story about a lighthouse keeper, as JSON.",
    "max_output_tokens": 160,
    "on_restart": "resume",
    "temperature": 1.0,
    "seed": 4242,
    "text": {"format": {"type": "json_schema", "name": "story", "schema": SCHEMA}},
}
KILLS = 3
STEP = 5


@pytest.mark.slow
def test_a_killed_structured_task_resumes_byte_identical(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    server = Server(data_dir, env={"LMSP_EXACT": "1"}).start()
    try:
        with server.client(timeout=600) as http:
            reference = http.post("/v1/responses", json=BODY).json()
            created = http.post("/v1/responses", json={**BODY, "background": True}).json()
        expected = text_of(reference)
        if reference["status"] == "completed":
            validate(json.loads(expected), SCHEMA)
        task_id = created["task"]["id"]

        kills = 0
        status, last = wait_for_events(data_dir, task_id, 2 + STEP)
        while kills < KILLS and status == "running":
            kills += kill_mid_task(server, data_dir, task_id)
            server.start()
            status, last = wait_for_events(data_dir, task_id, last + 1 + STEP)
        assert kills >= 1, "the task finished before the first kill"

        with server.client(timeout=600) as http:
            deadline = time.monotonic() + 600
            final: dict[str, Any]
            while (final := http.get(f"/v1/responses/{created['id']}").json())["status"] in (
                "queued",
                "in_progress",
            ):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert final["status"] == reference["status"]
        assert text_of(final) == expected
        assert final["usage"] == reference["usage"]

        conn = open_db(data_dir)
        check_log_invariants(conn)
        events = task_log(conn, task_id)
        conn.close()
        deltas = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
        assert deltas == expected
        resumed = [e for e in events if e["type"] == "response.in_progress" and e.get("resumed")]
        assert len(resumed) == kills
    finally:
        server.stop()
