"""``lmsp.Client`` and ``lmsp.AsyncClient`` against a real server (reconnecting across a
restart is in tests/cli/test_cli_subprocess.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import lmsp
from lmsp.client import default_target
from tests.helpers import Server, free_port, seeded_data_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("pyclient") / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.01"}).start()
    yield srv
    srv.stop()


def test_create_retrieve_stream_cancel(server: Server) -> None:
    with lmsp.Client(server.url + "/v1", server.token) as api:
        done = api.create(model="lmsp-test", input="hi", seed=4)
        assert done["status"] == "completed"
        assert api.retrieve(done["id"]) == done
        queued = api.create(model="lmsp-test", input="bg", background=True, idempotency_key="k1")
        again = api.create(model="lmsp-test", input="bg", background=True, idempotency_key="k1")
        assert again["id"] == queued["id"]
        events = list(api.stream(queued["id"]))
        assert events[-1]["type"] == "response.completed"
        assert [e["sequence_number"] for e in events] == list(range(len(events)))
        tail = list(api.stream(queued["id"], starting_after=5))
        assert tail[0]["sequence_number"] == 6
        assert api.cancel(queued["id"])["status"] == "completed"  # idempotent on finished
        task = api.task(queued["task"]["id"])
        assert [e["type"] for e in api.follow_task(task["id"])] == [e["type"] for e in events]
        assert api.tasks(limit=1)["data"][0]["id"] == task["id"]
        assert api.delete(queued["id"])["deleted"] is True


def test_errors_are_typed(server: Server) -> None:
    with lmsp.Client(server.url, server.token) as api:
        with pytest.raises(lmsp.APIError) as missing:
            api.retrieve("resp_missing")
        assert missing.value.status == 404
        assert missing.value.type == "not_found_error" and missing.value.code == "not_found"
        with pytest.raises(lmsp.APIError) as invalid:
            api.create(model="lmsp-test", input="x", temperature=9)
        assert invalid.value.status == 400 and invalid.value.param == "temperature"
        with pytest.raises(lmsp.APIError) as gone:
            list(api.stream("resp_missing"))
        assert gone.value.status == 404
    with lmsp.Client(server.url, "lmsp_wrong") as api, pytest.raises(lmsp.APIError) as denied:
        api.tasks()
    assert denied.value.status == 401 and denied.value.type == "authentication_error"
    nowhere = f"http://127.0.0.1:{free_port()}"
    with lmsp.Client(nowhere, "t") as api, pytest.raises(lmsp.UnreachableError) as down:
        api.retrieve("resp_x")
    assert str(down.value) == f"cannot reach lmsp at {nowhere}"
    with (
        lmsp.Client(nowhere, "t", reconnect_timeout=0.3) as api,
        pytest.raises(lmsp.UnreachableError),
    ):
        list(api.stream("resp_x"))


def test_async_client(server: Server) -> None:
    async def scenario() -> None:
        async with lmsp.AsyncClient(server.url, server.token) as api:
            created = await api.create(model="lmsp-test", input="async", background=True)
            events = [e async for e in api.stream(created["id"])]
            assert events[-1]["type"] == "response.completed"
            final = await api.retrieve(created["id"])
            assert final["status"] == "completed"
            assert (await api.cancel(created["id"]))["status"] == "completed"
            assert (await api.task(created["task"]["id"]))["status"] == "completed"
            assert (await api.cancel_task(created["task"]["id"]))["status"] == "completed"
            assert (await api.tasks(limit=1))["data"][0]["id"] == created["task"]["id"]
            follow = [e async for e in api.follow_task(created["task"]["id"], after=3)]
            assert follow[0]["sequence_number"] == 4
            with pytest.raises(lmsp.APIError) as missing:
                await api.retrieve("resp_missing")
            assert missing.value.code == "not_found"

    asyncio.run(scenario())


def test_defaults_come_from_the_environment(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMSP_URL", server.url)
    monkeypatch.setenv("LMSP_DATA_DIR", str(server.data_dir))
    monkeypatch.delenv("LMSP_TOKEN", raising=False)
    assert default_target() == (server.url, server.token)
    with lmsp.Client() as api:
        assert api.tasks()["object"] == "list"
