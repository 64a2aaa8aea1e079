"""A client's revocation holds against a create in flight and a task in the runner
(issue 30, item 5).

Before: a create whose files took seconds to read, revoked meanwhile, answered ``202``
(the revoke found no task to cancel) and the task ran to ``completed``. Now the create's
transaction checks the client again (``401 invalid_token``, nothing written), and the
runner checks it in every step it writes: a task of a revoked client is cancelled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from lmsp.app.service import Service
from lmsp.protocol.request import from_stored
from lmsp.protocol.states import Status
from lmsp.store import responses
from tests.helpers import Server, served, task_log
from tests.hostile import page_pdf, pdf_input
from tests.runner.test_runner import status

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    env = {"LMSP_INPUT_WORKERS": "1", "LMSP_FILE_CPU_TIME": "60s"}
    with served(Path(tmp_path_factory.mktemp("revoke")) / "data", env) as srv:
        yield srv


def new_client(server: Server) -> tuple[str, str]:
    made = server.client().post(
        "/v1/clients", json={"name": "doomed", "scopes": ["responses:write", "responses:read"]}
    )
    assert made.status_code == 201, made.text
    return made.json()["id"], made.json()["token"]


def test_a_create_revoked_while_its_files_are_read_makes_nothing(server: Server) -> None:
    client_id, token = new_client(server)
    # three files of ~3 s of text extraction each, read one after another (one worker)
    slow = pdf_input(page_pdf(b"BT /F1 12 Tf (slow to read) Tj " + b"() Tj " * 200_000 + b"ET"))
    files = [part for part in slow[0]["content"] if part["type"] == "input_file"]
    slow[0]["content"].extend(
        dict(part, filename=f"copy{i}.pdf") for i in range(2) for part in files
    )
    body = {"model": "lmsp-test", "input": slow, "background": True, "max_output_tokens": 8}
    answer: dict[str, Any] = {}

    def create() -> None:
        with httpx.Client(
            base_url=server.url, headers={"Authorization": f"Bearer {token}"}, timeout=120
        ) as http:
            got = http.post("/v1/responses", json=body)
            answer.update(status=got.status_code, body=got.json())

    thread = threading.Thread(target=create)
    thread.start()
    time.sleep(1.0)  # the request is authenticated and its files are being read
    assert thread.is_alive(), answer
    revoked = server.client().delete(f"/v1/clients/{client_id}")
    assert revoked.status_code == 200 and revoked.json()["cancelled_tasks"] == []
    thread.join(120)

    assert answer["status"] == 401, answer
    assert answer["body"]["error"]["code"] == "invalid_token"
    tasks = server.client().get("/v1/tasks", params={"limit": 100}).json()["data"]
    assert [t for t in tasks if t.get("client_id") == client_id] == []


def test_the_runner_cancels_a_task_of_a_revoked_client(svc: Service) -> None:
    """A task whose client is revoked without the revoke's own cancel (a revoke that
    raced it) runs no step: the runner cancels it."""
    conn = svc.db.reader()
    svc.db.write_sync(
        lambda c: c.execute(
            "INSERT INTO clients (id, name, token_prefix, token_hash, scopes, created_at)"
            " VALUES ('cli_gone', 'gone', 'x', 'x', '[]', 0)"
        )
    )
    body = {"model": "lmsp-test", "input": "hello", "background": True, "seed": 7}
    created = svc.db.write_sync(
        lambda c: responses.create(
            c,
            client_id="cli_gone",
            request=from_stored(body),
            on_restart="fail",
            max_queue=100,
            key=None,
        )
    )
    svc.db.write_sync(
        lambda c: c.execute("UPDATE clients SET revoked_at = 1 WHERE id = 'cli_gone'")
    )
    assert svc.runner.run_next() == created.task_id
    assert status(svc, created.task_id) is Status.CANCELLED
    kinds = [e["type"] for e in task_log(conn, created.task_id)]
    assert "response.in_progress" not in kinds and "response.output_text.delta" not in kinds
    assert kinds[-1] == "response.cancelled"
