"""The store's readers of ``tasks`` and ``responses`` return typed records (issue 37):
every column a field with its Python type, for a row written now (on either store) and
for rows as the code before wrote them; and no module above the store reads a task or
a response by a column name."""

from __future__ import annotations

import ast
import sqlite3
from pathlib import Path

import pytest

import lmsp
from lmsp.app.service import Service
from lmsp.config import Settings
from lmsp.protocol import objects
from lmsp.protocol.records import ResponseRecord, TaskRecord
from lmsp.protocol.request import PreparedRequest, from_stored
from lmsp.protocol.states import Policy, Status
from lmsp.store import responses as response_store
from lmsp.store import snapshots
from lmsp.store import tasks as task_store
from lmsp.store.db import Database
from lmsp.store.sql import Conn

SRC = Path(lmsp.__file__).parent
OLD = Path(__file__).with_name("old")


@pytest.fixture(params=["sqlite", "postgres"])
def settings(request: pytest.FixtureRequest, settings: Settings) -> Settings:
    if request.param == "sqlite":
        return settings
    return settings.with_overrides(database_url=request.getfixturevalue("pg_url"))


def columns(conn: Conn, table: str, key: str, value: str) -> list[str]:
    row = conn.execute(f"SELECT * FROM {table} WHERE {key} = ?", (value,)).fetchone()
    assert row is not None
    return list(row.keys())


def create(svc: Service) -> tuple[str, str]:
    owner = svc.db.reader().execute(
        "SELECT value FROM service_config WHERE key = 'owner_client_id'"
    )
    client_id = str(owner.fetchone()[0])
    request = {"model": "lmsp-test", "input": "hi", "background": True, "service_tier": "flex"}

    def job(conn: Conn) -> tuple[str, str]:
        created = response_store.create(
            conn,
            client_id=client_id,
            request=from_stored(request),
            on_restart="resume",
            max_queue=100,
            key=None,
        )
        return created.task_id, created.response_id

    result: tuple[str, str] = svc.db.write_sync(job)
    return result


def test_a_row_written_now_reads_as_a_typed_record(svc: Service) -> None:
    """Every reader gives the record, each column a field of its type, through the
    task's whole life (on SQLite and on PostgreSQL)."""
    task_id, response_id = create(svc)
    conn = svc.db.reader()
    assert set(columns(conn, "tasks", "id", task_id)) == set(TaskRecord.__struct_fields__)
    assert set(columns(conn, "responses", "id", response_id)) == set(
        ResponseRecord.__struct_fields__
    )
    task = task_store.get(conn, task_id)
    assert isinstance(task, TaskRecord)
    assert task.status is Status.QUEUED and task.on_restart is Policy.RESUME
    assert (task.id, task.response_id, task.attempt, task.tier) == (task_id, response_id, 1, 0)
    assert task.snapshot is None and task.finished_at is None and task.error is None
    assert isinstance(task.seq, int) and isinstance(task.created_at, int)
    assert task_store.of_response(conn, response_id) == task
    assert task_store.page(conn, None, None, None, 10) == [task]
    assert task_store.unfinished(conn) == [task]
    response = task_store.get_response(conn, response_id)
    assert isinstance(response, ResponseRecord)
    assert isinstance(response.request, PreparedRequest)
    assert response.request.model == "lmsp-test" and response.request.service_tier == "flex"
    assert response.background is True and response.store is True
    assert response.usage is None and response.output is None and response.previous_id is None

    claimed = svc.db.write_sync(lambda c: task_store.claim_next(c))
    assert isinstance(claimed, TaskRecord) and claimed.status is Status.LOADING
    started = svc.db.write_sync(lambda c: task_store.start(c, task_id, "sha256:ab"))
    assert isinstance(started, TaskRecord) and started.status is Status.RUNNING
    snap = {"tokens": [1, 2, 3], "seed": 7, "held": ""}
    assert svc.db.write_sync(lambda c: task_store.append_output(c, task_id, [], snap))
    running = task_store.get(svc.db.reader(), task_id)
    assert running is not None and running.snapshot is not None
    assert running.snapshot["token_count"] == 3 and running.snapshot["seed"] == 7

    usage = objects.usage_counts(4, 3)
    item = {"type": "message", "id": "msg_1", "status": "completed", "role": "assistant"}
    done = task_store.Completion([], [item], usage, "max_output_tokens")
    finished = svc.db.write_sync(lambda c: task_store.complete(c, task_id, done))
    assert isinstance(finished, TaskRecord) and finished.status is Status.COMPLETED
    assert isinstance(finished.finished_at, int) and finished.snapshot is None
    response = task_store.get_response(svc.db.reader(), response_id)
    assert response is not None and response.model_digest == "sha256:ab"
    assert response.usage == usage and response.output == [item]
    assert response.incomplete_reason == "max_output_tokens"


def old_database(path: Path) -> None:
    """A data directory the code before wrote: the old migrations' database with its rows
    (tests/store/old/m016.sql: a finished task of a turn of a conversation, its request
    as stored before input items were normalized), and a task left running with its
    usage and a snapshot as versions before the token chunks wrote them."""
    raw = sqlite3.connect(path)
    raw.executescript((OLD / "m016.sql").read_text())
    raw.execute(
        "INSERT INTO responses VALUES('resp_2','cli_owner','m1','sha256:cd',1700000400,"
        ' \'{"model":"m1","input":"again","previous_response_id":"resp_1"}\',0,0,'
        ' \'{"input_tokens":2,"output_tokens":3,"total_tokens":5}\',NULL,NULL,\'resp_1\',NULL)'
    )
    raw.execute(
        "INSERT INTO tasks VALUES(2,'task_2','resp_2','cli_owner','running','resume',2,6,"
        "1700000400,1700000402,NULL,NULL,NULL,"
        ' \'{"tokens":[5,6,7],"seed":3,"held":"x","sequence_number":6}\',NULL,0,2)'
    )
    raw.commit()
    raw.close()


def test_rows_the_code_before_wrote_read_as_typed_records(tmp_path: Path) -> None:
    path = tmp_path / "lmsp.db"
    old_database(path)
    db = Database(path)
    try:
        conn = db.reader()
        done = task_store.get(conn, "task_1")
        assert isinstance(done, TaskRecord)
        assert done.status is Status.COMPLETED and done.on_restart is Policy.FAIL
        assert (done.finished_at, done.tier, done.node_id) == (1700000301, 1, None)
        first = task_store.get_response(conn, "resp_1")
        assert isinstance(first, ResponseRecord)
        assert first.request.model == "m1" and len(first.request.input) == 1
        assert first.output == [] and first.conversation_id == "conv_1"
        assert first.background is True and first.store is True and first.usage is None

        running = task_store.get(conn, "task_2")
        assert running is not None and running.status is Status.RUNNING
        assert running.snapshot == {"tokens": [5, 6, 7], "seed": 3, "held": "x",
                                    "sequence_number": 6}  # fmt: skip
        assert task_store.unfinished(conn) == [running]
        second = task_store.get_response(conn, "resp_2")
        assert second is not None and second.previous_id == "resp_1"
        assert second.background is False and second.store is False
        assert second.usage == {"input_tokens": 2, "output_tokens": 3, "total_tokens": 5}
        assert second.request.previous_response_id == "resp_1"
        shown = task_store.render_response(conn, running)
        assert shown["usage"]["input_tokens_details"]["cached_tokens"] == 0
        assert shown["task"] == {
            "id": "task_2",
            "status": "running",
            "on_restart": "resume",
            "attempt": 2,
            "queue_position": None,
        }
        # the legacy snapshot (its tokens in the JSON) is carried over by the next flush
        more = {"tokens": [5, 6, 7, 8], "seed": 3, "held": ""}
        assert db.write_sync(lambda c: task_store.append_output(c, "task_2", [], more))
        assert snapshots.read(db.reader(), "task_2") == {
            **more,
            "sequence_number": 6,
        }
    finally:
        db.close()


# -- nothing above the store reads a task or a response by a column name ----------------

#: the names a task or a response record goes by (and ``x.task``, ``x.response``)
NAMES = ("task", "response")


def _record_name(node: ast.expr) -> str | None:
    name = node.id if isinstance(node, ast.Name) else None
    if isinstance(node, ast.Attribute):
        name = node.attr
    if name is not None and (name in NAMES or name.endswith(tuple(f"_{n}" for n in NAMES))):
        return name
    return None


def _reads_the_store(tree: ast.Module) -> bool:
    """Whether a module can hold a record: it imports the store (whose readers give
    them) or the records' module (a function typed to take one)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        if any(n.startswith(("lmsp.store", "lmsp.protocol.records")) for n in names):
            return True
    return False


def keyed_reads(source: str) -> list[tuple[int, str]]:
    """The ``task["..."]`` / ``response["..."]`` reads of a module that can hold a record
    (the others hold a response object of the wire under that name: the translators,
    the command line)."""
    tree = ast.parse(source)
    if not _reads_the_store(tree):
        return []
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Subscript) or _record_name(node.value) is None:
            continue
        key = node.slice
        if isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append((node.lineno, ast.unparse(node)))
    return sorted(found)


def test_no_module_above_the_store_reads_a_record_by_a_column_name() -> None:
    """``mypy --strict`` refuses a subscript of a record; this also catches one that
    reaches code as ``Any`` (a row passed through untyped)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        module = path.relative_to(SRC).as_posix()
        if module.startswith("store/"):
            continue  # the store reads its rows; the records are made there
        for line, access in keyed_reads(path.read_text()):
            found.append(f"{module}:{line}: {access}")
    assert not found, "a task or response read by a column name:\n" + "\n".join(found)


def test_the_check_sees_what_it_must() -> None:
    caught = keyed_reads(
        "from lmsp.store import tasks as task_store\n"
        "def f(conn, found):\n"
        "    task = task_store.get(conn, 'x')\n"
        "    return task['status'], found.response['id'], self.task['id'], old_task['seq']\n"
    )
    assert sorted(access for _, access in caught) == [
        "found.response['id']",
        "old_task['seq']",
        "self.task['id']",
        "task['status']",
    ]
    assert not keyed_reads(
        "from lmsp.protocol.records import TaskRecord\n"
        "def f(task: TaskRecord, rows: Any, i: int):\n"
        "    return task.status, rows['status'], task[i]\n"
    )
    # a module that cannot hold a record (a translator of the wire's response object)
    assert not keyed_reads("def f(response: dict[str, Any]):\n    return response['status']\n")
