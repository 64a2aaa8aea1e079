"""``lmsp webhooks add | ls | deliveries | rm`` against a real server and receiver."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner, Result
from standardwebhooks.webhooks import WebhookVerificationError

from lmsp.cli import main
from tests.helpers import Server, seeded_data_dir
from tests.webhook_receiver import Receiver, verify

pytestmark = pytest.mark.slow


@pytest.fixture
def server(tmp_path: Path, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_WEBHOOK_RETRY": "0.2s"}).start()
    yield srv
    srv.stop()


def lmsp(server: Server, *args: str) -> Result:
    env = {"LMSP_URL": server.url, "LMSP_DATA_DIR": str(server.data_dir), "LMSP_TOKEN": None}
    return CliRunner().invoke(main, ["webhooks", *args], env=env, catch_exceptions=False)


def test_add_list_deliveries_remove(server: Server) -> None:
    receiver = Receiver().start()
    try:
        added = lmsp(server, "add", receiver.url, "--event", "response.completed")
        assert added.exit_code == 0, added.output
        secret = added.stdout.strip()
        assert secret.startswith("whsec_")
        assert "shown once" in added.stderr
        (hook,) = json.loads(lmsp(server, "ls", "--json").stdout)
        assert hook["url"] == receiver.url and hook["events"] == ["response.completed"]
        assert hook["id"] in lmsp(server, "ls").stdout
        with server.client() as http:
            made = http.post("/v1/responses", json={"model": "lmsp-test", "input": "hi"})
        receiver.wait_for(lambda got: len(got) == 1)
        assert verify(receiver.received()[0], secret)["data"]["id"] == made.json()["id"]
        deadline = time.monotonic() + 60
        while True:
            rows = json.loads(lmsp(server, "deliveries", hook["id"], "--json").stdout)
            if rows and rows[0]["status"] == "delivered":
                break
            assert time.monotonic() < deadline, rows
            time.sleep(0.05)
        shown = lmsp(server, "deliveries", hook["id"]).stdout
        assert "delivered" in shown and made.json()["id"] in shown
        assert lmsp(server, "rm", hook["id"]).exit_code == 0
        assert json.loads(lmsp(server, "ls", "--json").stdout) == []
        gone = lmsp(server, "rm", hook["id"])
        assert gone.exit_code != 0 and "Traceback" not in gone.output
        refused = lmsp(server, "add", "http://169.254.169.254/")
        assert refused.exit_code != 0 and "invalid_webhook_url" in refused.stderr
        assert "Traceback" not in refused.output
        assert httpx.get(f"{server.url}/healthz").status_code == 200
    finally:
        receiver.stop()


def test_update_and_rotate(server: Server) -> None:
    """``update`` moves deliveries to another URL and changes the events heard;
    ``rotate`` prints a new secret once, and deliveries are signed with it only."""
    first, second = Receiver().start(), Receiver().start()
    try:
        added = lmsp(server, "add", first.url)
        assert added.exit_code == 0, added.output
        old_secret = added.stdout.strip()
        (hook,) = json.loads(lmsp(server, "ls", "--json").stdout)
        unchanged = lmsp(server, "update", hook["id"], "--json")  # nothing given: shown
        assert unchanged.exit_code == 0, unchanged.output
        assert json.loads(unchanged.stdout)["url"] == first.url
        moved = lmsp(
            server,
            "update",
            hook["id"],
            "--to",
            second.url,
            "--event",
            "response.completed",
            "--description",
            "moved",
        )
        assert moved.exit_code == 0, moved.output
        assert second.url in moved.stderr
        (shown,) = json.loads(lmsp(server, "ls", "--json").stdout)
        assert shown["url"] == second.url and shown["events"] == ["response.completed"]
        assert shown["description"] == "moved"
        rotated = lmsp(server, "rotate", hook["id"])
        assert rotated.exit_code == 0, rotated.output
        new_secret = rotated.stdout.strip()
        assert new_secret.startswith("whsec_") and new_secret != old_secret
        assert "shown once" in rotated.stderr
        assert new_secret not in lmsp(server, "ls", "--json").stdout
        with server.client() as http:
            made = http.post("/v1/responses", json={"model": "lmsp-test", "input": "hi"})
        second.wait_for(lambda got: len(got) == 1)
        delivery = second.received()[0]
        assert verify(delivery, new_secret)["data"]["id"] == made.json()["id"]
        with pytest.raises(WebhookVerificationError):  # the old secret signs nothing now
            verify(delivery, old_secret)
        assert first.received() == []
        unknown = lmsp(server, "rotate", "wh_missing")
        assert unknown.exit_code != 0 and "Traceback" not in unknown.output
    finally:
        first.stop()
        second.stop()
