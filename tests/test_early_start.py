"""A create's first turn begun while the writer commits it (runner/early.py), through the
real server: the idle worker whose claim rides in the create's commit starts the
generation in the engine meanwhile, and the task's attempt adopts it — the same answer,
the same events, a cancel still stops it, and a first turn that is not its task's is
cancelled in the engine.

What was begun early is counted on ``/metrics`` (``lmsp_early_starts_total``, by
outcome): the counts show the path was taken, the answers that it changed nothing."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from lmsp.engines.client import EngineClient
from lmsp.protocol.records import TaskRecord
from lmsp.protocol.request import PreparedRequest
from lmsp.protocol.states import Policy, Status
from lmsp.runner import early
from lmsp.store.models import ModelRecord
from lmsp.store.responses import Created
from tests.helpers import check_log_invariants, early_starts, finish, idle, open_db, served

BODY = {"model": "lmsp-test", "background": True, "temperature": 0}
QUIET = {"LMSP_TEST_ENGINE_DELAY": "0", "LMSP_GC_INTERVAL": "1h"}


def test_a_first_turn_begun_during_the_commit_gives_the_same_answer(tmp_path: Path) -> None:
    data = tmp_path / "data"
    inputs = [f"say something about {word}" for word in ("ships", "rain", "maps", "owls")]
    with served(data, env=QUIET) as server, server.client() as http:
        # the model is not loaded yet: this first one waits for its load, not begun early
        plain = finish(
            http, http.post("/v1/responses", json={**BODY, "input": inputs[0]}).json()["id"]
        )
        assert plain["status"] == "completed" and early_starts(http) == {}
        answers = {}
        for text in inputs:
            idle(http)
            made = http.post("/v1/responses", json={**BODY, "input": text})
            assert made.status_code == 202, made.text
            answers[text] = finish(http, made.json()["id"])
        idle(http)
        streamed = http.post(
            "/v1/responses", json={"model": "lmsp-test", "input": inputs[1], "stream": True}
        )
        assert streamed.status_code == 200 and "response.completed" in streamed.text
        counts = early_starts(http)
        print(f"first turns begun early: {counts}")
        assert counts.get("adopted", 0) >= 4 and counts.get("dropped", 0) == 0, counts
        assert all(a["status"] == "completed" for a in answers.values())
        said = {text: answer["output"][0]["content"][0]["text"] for text, answer in answers.items()}
        assert said[inputs[0]] == plain["output"][0]["content"][0]["text"]  # as if not begun early
        assert len(set(said.values())) == len(inputs)  # each its own answer
    conn = open_db(data)
    try:
        check_log_invariants(conn)  # gap-free from 0, one terminal event, the last
    finally:
        conn.close()


def text_of(response: dict[str, Any]) -> str:
    return str(response["output"][0]["content"][0]["text"])


def test_a_cancel_stops_a_first_turn_begun_early(tmp_path: Path) -> None:
    data = tmp_path / "data"
    slow = {"LMSP_TEST_ENGINE_DELAY": "0.05", "LMSP_TEST_ENGINE_LENGTH": "400"}
    with served(data, env=slow) as server, server.client() as http:
        finish(
            http,
            http.post("/v1/responses", json={**BODY, "input": "x", "max_output_tokens": 2}).json()[
                "id"
            ],
        )
        idle(http)
        made = http.post("/v1/responses", json={**BODY, "input": "a long one"}).json()
        deadline = time.monotonic() + 30
        while http.get(f"/v1/responses/{made['id']}").json()["status"] != "in_progress":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert http.post(f"/v1/responses/{made['id']}/cancel").status_code == 200
        assert finish(http, made["id"])["status"] == "cancelled"
        idle(http)  # the engine's sequence is free again: the model is idle
        assert early_starts(http).get("adopted", 0) == 1
        engine = http.get("/v1/service/activity").json()
        assert engine["sequences"] == []


_MODEL = ModelRecord("m", "gguf", "lmsp-test", "sha256:00", 1, "lmsp", 0, {})


def _task(task_id: str) -> TaskRecord:
    return TaskRecord(
        seq=1,
        id=task_id,
        response_id="resp_x",
        client_id="cli_x",
        status=Status.RUNNING,
        on_restart=Policy.FAIL,
        attempt=1,
        last_sequence_number=0,
        created_at=0,
        updated_at=0,
        finished_at=None,
        error_code=None,
        error_message=None,
        snapshot=None,
        node_id=None,
        lease_epoch=0,
        tier=1,
    )


def _first(created: Created | BaseException | None) -> early.FirstTurn:
    """A first turn whose create's write is answered with ``created`` (or not yet)."""
    done: concurrent.futures.Future[Created] = concurrent.futures.Future()
    if isinstance(created, BaseException):
        done.set_exception(created)
    elif created is not None:
        done.set_result(created)
    return early.FirstTurn(PreparedRequest(model="m", input=()), _MODEL, done)


def test_a_first_turn_is_claimed_only_by_its_own_task() -> None:
    """The worker keeps what it began only if the claim in the create's commit took the
    create's own task: not a replay, not another task, not after a failed commit."""
    ours, other = _task("task_1"), _task("task_2")
    fresh = Created("resp_1", "task_1", 202, replayed=False)
    assert early.claimed(_first(fresh), (ours, True))
    assert not early.claimed(_first(fresh), None)  # the claim took nothing
    assert not early.claimed(_first(fresh), (other, True))  # an older task came first
    assert not early.claimed(_first(None), (ours, True))  # its write not answered yet
    replay = Created("resp_1", "task_1", 200, replayed=True)
    assert not early.claimed(_first(replay), (ours, False))
    assert not early.claimed(_first(OSError("disk full")), (ours, True))


def test_a_turn_that_continues_a_history_is_begun_early_too(tmp_path: Path) -> None:
    """A previous response's turns and a conversation's items: the history the create's
    length check read is the one the runner reads back, so the prompt begun early is
    the one its attempt asks for."""
    data = tmp_path / "data"
    with served(data, env=QUIET) as server, server.client() as http:
        first = finish(http, http.post("/v1/responses", json={**BODY, "input": "one"}).json()["id"])
        idle(http)
        after = {**BODY, "input": "two", "previous_response_id": first["id"]}
        second = finish(http, http.post("/v1/responses", json=after).json()["id"])
        assert second["status"] == "completed"
        conversation = http.post("/v1/conversations", json={}).json()["id"]
        for text in ("three", "four"):
            idle(http)
            turn = {**BODY, "input": text, "conversation": conversation}
            assert finish(http, http.post("/v1/responses", json=turn).json()["id"])["status"] == (
                "completed"
            )
        counts = early_starts(http)
        assert counts == {"adopted": 3}, counts
        # the answer is the one to the same messages given whole, as one input
        said = first["output"][0]["content"][0]["text"]
        whole = [
            {"role": "user", "content": "one"},
            {"role": "assistant", "content": said},
            {"role": "user", "content": "two"},
        ]
        idle(http)
        again = finish(http, http.post("/v1/responses", json={**BODY, "input": whole}).json()["id"])
        assert text_of(again) == text_of(second)


def test_a_first_turn_with_other_inputs_is_cancelled_when_its_task_starts_its_own(
    client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Were the inputs begun early ever not the ones the attempt asks for, the first turn
    is cancelled as soon as the attempt's own generation starts — not when the task
    ends — and the task runs its own, unharmed. (Begun here with one token less of
    budget, which no real create does.)"""
    monkeypatch.setenv("LMSP_TEST_ENGINE_DELAY", "0.02")
    monkeypatch.setenv("LMSP_TEST_ENGINE_LENGTH", "200")
    real = EngineClient.begin_early

    def skewed(
        self: EngineClient, prompt: list[int], sampling: Any, grammar: Any, budget: int
    ) -> Any:
        return real(self, prompt, sampling, grammar, budget - 1)

    monkeypatch.setattr(EngineClient, "begin_early", skewed)
    body = {**BODY, "input": "x", "max_output_tokens": 2}
    finish(client, client.post("/v1/responses", json=body).json()["id"])  # loaded
    idle(client)
    made = client.post("/v1/responses", json={**BODY, "input": "a long answer"}).json()
    deadline = time.monotonic() + 30
    while early_starts(client).get("dropped", 0) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    running = client.get(f"/v1/responses/{made['id']}").json()
    assert running["status"] == "in_progress"  # settled at its start, not at its end
    done = finish(client, made["id"])
    assert done["status"] == "completed" and len(text_of(done).split()) == 200
    assert early_starts(client) == {"dropped": 1}
