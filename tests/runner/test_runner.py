from __future__ import annotations

import random
import threading
import time
from typing import Any

import pytest

from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.protocol.assembler import OutputAssembler
from lmsp.protocol.request import from_stored
from lmsp.protocol.states import Status
from lmsp.store import responses
from lmsp.store import tasks as task_store
from tests.helpers import check_log_invariants, task_log, text_events


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    """Every test here runs on both stores."""
    if request.param == "sqlite":
        return settings
    return settings.with_overrides(database_url=request.getfixturevalue("pg_url"))


def owner_id(svc: Service) -> str:
    row = svc.db.reader().execute("SELECT value FROM service_config WHERE key = 'owner_client_id'")
    return str(row.fetchone()[0])


def enqueue(svc: Service, **request: Any) -> str:
    body = {"model": "lmsp-test", "input": "hello", "background": True, "seed": 7, **request}

    def job(conn: Any) -> responses.Created:
        return responses.create(
            conn,
            client_id=owner_id(svc),
            request=from_stored(body),
            on_restart=body.get("on_restart", "fail"),
            max_queue=10_000,
            key=None,
        )

    return svc.db.write_sync(job).task_id


def status(svc: Service, task_id: str) -> Status:
    task = task_store.get(svc.db.reader(), task_id)
    assert task is not None
    return task.status


def test_run_next_runs_a_task_to_completion(svc: Service) -> None:
    task_id = enqueue(svc)
    assert svc.runner.run_next() == task_id
    assert status(svc, task_id) is Status.COMPLETED
    kinds = [e["type"] for e in task_log(svc.db.reader(), task_id)]
    assert kinds[:5] == [
        "response.created",
        "response.queued",
        "response.loading",
        "response.in_progress",
        "response.output_item.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]
    deltas = [
        e["delta"]
        for e in task_log(svc.db.reader(), task_id)
        if e["type"] == "response.output_text.delta"
    ]
    response = svc.response_object(task_id)
    assert "".join(deltas) == response["output"][0]["content"][0]["text"]
    assert response["usage"]["output_tokens"] == 24
    assert svc.runner.run_next() is None
    check_log_invariants(svc.db.reader())


def test_tasks_run_in_fifo_order(svc: Service) -> None:
    ids = [enqueue(svc, input=f"prompt {i}") for i in range(5)]
    assert [svc.runner.run_next() for _ in ids] == ids


def test_the_reserved_slot_claims_nothing_while_a_regular_one_is_free(svc: Service) -> None:
    """The reserved sequence (``LMSP_RESERVED_SEQUENCES``) is for a client whose request
    would wait behind another's running tasks: with a regular slot free it takes none."""
    assert svc.runner.reserved == 1
    task_id = enqueue(svc)
    assert svc.runner.run_next(slot=svc.runner.parallel) is None
    assert status(svc, task_id) is Status.QUEUED
    assert svc.runner.run_next(0) == task_id


def test_max_output_tokens_gives_incomplete(svc: Service) -> None:
    task_id = enqueue(svc, max_output_tokens=5)
    svc.runner.run_next()
    response = svc.response_object(task_id)
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": "max_output_tokens"}
    assert response["usage"]["output_tokens"] == 5
    assert task_log(svc.db.reader(), task_id)[-1]["type"] == "response.incomplete"


def test_engine_errors_fail_the_task_with_their_code(svc: Service) -> None:
    task_id = enqueue(svc, input="please [engine-error]")
    svc.runner.run_next()
    response = svc.response_object(task_id)
    assert response["status"] == "failed"
    assert response["error"]["code"] == "engine_error"
    assert task_log(svc.db.reader(), task_id)[-1]["type"] == "response.failed"
    check_log_invariants(svc.db.reader())


def test_a_missing_blob_fails_with_model_corrupt(svc: Service, settings: Settings) -> None:
    for blob in settings.blobs_dir.iterdir():
        if blob.stat().st_size < 100:  # the test engine's blob
            blob.write_bytes(b"truncated")
    task_id = enqueue(svc)
    svc.runner.run_next()
    assert svc.response_object(task_id)["error"]["code"] == "model_corrupt"


def test_cancel_of_a_queued_task_is_immediate(svc: Service) -> None:
    task_id = enqueue(svc)
    moved = svc.db.write_sync(lambda c: task_store.cancel(c, task_id))
    assert moved is not None and moved.status == "cancelled"
    assert svc.runner.run_next() is None
    assert [e["type"] for e in task_log(svc.db.reader(), task_id)][-1] == "response.cancelled"


def test_cancel_is_idempotent_on_finished_tasks(svc: Service) -> None:
    task_id = enqueue(svc)
    svc.runner.run_next()
    before = task_log(svc.db.reader(), task_id)
    assert svc.db.write_sync(lambda c: task_store.cancel(c, task_id)) is None
    assert task_log(svc.db.reader(), task_id) == before


def _running_task(svc: Service) -> str:
    task_id = enqueue(svc)
    svc.db.write_sync(task_store.claim_next)
    svc.db.write_sync(lambda c: task_store.start(c, task_id, None))
    batch = text_events(OutputAssembler(), ["a ", "b "])
    svc.db.write_sync(lambda c: task_store.append_output(c, task_id, batch, {"tokens": []}))
    return task_id


def test_cancel_races_completion_1000_times(svc: Service) -> None:
    """Both are guarded updates from two threads at once: exactly one wins, every time."""
    outcomes = {Status.COMPLETED: 0, Status.CANCELLED: 0}
    usage = {"input_tokens": 1, "output_tokens": 2, "total_tokens": 3}
    finished = OutputAssembler.replay(text_events(OutputAssembler(), ["a ", "b "]))
    closing, output = finished.finish(), finished.items
    for _ in range(1000):
        task_id = _running_task(svc)
        barrier = threading.Barrier(2)
        results: dict[str, Any] = {}

        def completer(
            task_id: str = task_id, barrier: threading.Barrier = barrier, results: dict = results
        ) -> None:
            barrier.wait()
            time.sleep(random.random() * 0.0005)
            results["settle"] = svc.db.write_sync(
                lambda c: task_store.settle(
                    c, task_id, task_store.Completion(closing, output, usage)
                )
            )

        def canceller(
            task_id: str = task_id, barrier: threading.Barrier = barrier, results: dict = results
        ) -> None:
            barrier.wait()
            time.sleep(random.random() * 0.0005)
            results["cancel"] = svc.db.write_sync(lambda c: task_store.cancel(c, task_id))

        threads = [threading.Thread(target=completer), threading.Thread(target=canceller)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = status(svc, task_id)
        if results["cancel"] is not None:
            # the cancel won: completion changed nothing, the runner's settle finished it
            assert results["cancel"].status == "cancelling"
            assert results["settle"] is Status.CANCELLED
            assert final is Status.CANCELLED
        else:
            assert results["settle"] is Status.COMPLETED
            assert final is Status.COMPLETED
        outcomes[final] += 1
        kinds = [e["type"] for e in task_log(svc.db.reader(), task_id)]
        terminal = [k for k in kinds if k in ("response.completed", "response.cancelled")]
        assert len(terminal) == 1 and kinds[-1] == terminal[0]
    check_log_invariants(svc.db.reader())
    assert sum(outcomes.values()) == 1000
    print("cancel race outcomes:", outcomes)
    # both orders happened: the test raced for real
    assert outcomes[Status.COMPLETED] > 0 and outcomes[Status.CANCELLED] > 0


def test_cancel_races_the_real_runner(svc: Service) -> None:
    """Cancel at random moments while worker threads generate: never both terminal."""
    svc.runner.start()
    ids = []
    for _ in range(150):
        task_id = enqueue(svc)
        svc.runner.notify()
        time.sleep(random.random() * 0.02)
        svc.db.write_sync(lambda c, t=task_id: task_store.cancel(c, t))
        svc.runner.request_cancel(task_id)
        ids.append(task_id)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if all(status(svc, t).terminal for t in ids):
            break
        time.sleep(0.05)
    finals = [status(svc, t) for t in ids]
    assert all(s in (Status.COMPLETED, Status.CANCELLED) for s in finals)
    check_log_invariants(svc.db.reader())


def test_snapshot_is_written_with_the_deltas_it_covers(svc: Service) -> None:
    task_id = _running_task(svc)
    task = task_store.get(svc.db.reader(), task_id)
    assert task is not None
    assert task.snapshot is not None
    assert task.snapshot["sequence_number"] == task.last_sequence_number
    deltas = [e for e in task_log(svc.db.reader(), task_id) if "delta" in e]
    assert "".join(e["delta"] for e in deltas) == "a b "
    # the output so far is what the log the snapshot covers describes
    shown = task_store.render_response(svc.db.reader(), task)
    assert shown["output"][0]["content"][0]["text"] == "a b "
    assert shown["output"][0]["status"] == "in_progress"
