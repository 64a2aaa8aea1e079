"""Every ``lmsp`` command through click's runner against a real server, including the
pairing flow (CLI for the operator, HTTP for the agent) with deny, expiry and double
claim, and one-line errors."""

from __future__ import annotations

import json
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from click.testing import CliRunner, Result

from lmsp.app.service import Service
from lmsp.cli import main
from lmsp.config import Settings
from tests.helpers import Server, free_port, open_db, seeded_data_dir

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, blob_cache: Path) -> Iterator[Server]:
    data_dir = seeded_data_dir(tmp_path_factory.mktemp("cli") / "data", blob_cache)
    srv = Server(data_dir, env={"LMSP_TEST_ENGINE_DELAY": "0.01"}).start()
    yield srv
    srv.stop()


def lmsp(server: Server, *args: str, **env: str | None) -> Result:
    environment: dict[str, str | None] = {
        "LMSP_URL": server.url,
        "LMSP_DATA_DIR": str(server.data_dir),
        "LMSP_TOKEN": None,
    }
    environment.update(env)
    return CliRunner().invoke(main, list(args), env=environment, catch_exceptions=False)


def ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def fails(result: Result, text: str) -> None:
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0], lines


def as_json(result: Result) -> Any:
    return json.loads(ok(result))


def text_of(obj: dict[str, Any]) -> str:
    return "".join(c["text"] for item in obj["output"] for c in item["content"])


def test_run_streams_the_text(server: Server) -> None:
    out = ok(lmsp(server, "run", "say something", "-m", "lmsp-test", "--seed", "3"))
    task = as_json(lmsp(server, "tasks", "ls", "--json", "--limit", "1"))[0]
    with server.client() as http:
        final = http.get(f"/v1/responses/{task['response_id']}").json()
    assert final["status"] == "completed" and out == text_of(final) + "\n"
    obj = as_json(lmsp(server, "run", "again", "-m", "lmsp-test", "--json"))
    assert obj["status"] == "completed" and text_of(obj)


def test_run_in_the_background_then_the_tasks_commands(server: Server) -> None:
    queued = as_json(
        lmsp(
            server,
            "run",
            "bg",
            "-m",
            "lmsp-test",
            "--background",
            "--on-restart",
            "retry",
            "--json",
        )
    )
    assert queued["status"] == "queued" and queued["task"]["on_restart"] == "retry"
    task_id = queued["task"]["id"]
    followed = ok(lmsp(server, "tasks", "follow", task_id))
    shown = as_json(lmsp(server, "tasks", "show", task_id, "--json"))
    assert shown["task"]["status"] == "completed"
    assert followed == text_of(shown["response"]) + "\n"
    events = [
        json.loads(line)
        for line in ok(lmsp(server, "tasks", "follow", task_id, "--json")).splitlines()
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    tail = ok(lmsp(server, "tasks", "follow", task_id, "--json", "--after", "5")).splitlines()
    assert json.loads(tail[0])["sequence_number"] == 6

    table = ok(lmsp(server, "tasks", "ls"))
    assert task_id in table and "completed" in table
    human = ok(lmsp(server, "tasks", "show", queued["id"]))  # a response id works too
    assert task_id in human and text_of(shown["response"]).split()[0] in human
    background = ok(lmsp(server, "run", "bg2", "-m", "lmsp-test", "--background"))
    assert background.startswith("resp_")


def test_cancel(server: Server) -> None:
    with server.client() as http:
        created = http.post(
            "/v1/responses",
            json={"model": "lmsp-test", "input": "long", "background": True},
        ).json()
    cancelled = as_json(lmsp(server, "tasks", "cancel", created["task"]["id"], "--json"))
    assert cancelled["status"] in {"cancelling", "cancelled", "completed"}
    result = ok(lmsp(server, "tasks", "cancel", created["task"]["id"]))
    assert created["task"]["id"] in result
    follow = lmsp(server, "tasks", "follow", created["task"]["id"])
    if cancelled["status"] != "completed":
        fails(follow, "cancelled")


def request_pairing(server: Server, name: str) -> dict[str, Any]:
    made = httpx.post(f"{server.url}/v1/pairing", json={"client_name": name})
    assert made.status_code == 201
    return made.json()  # type: ignore[no-any-return]


def claim(server: Server, pair_id: str) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/pairing/{pair_id}/token")


def test_pairing_through_the_cli_and_the_http_api(server: Server) -> None:
    agent = request_pairing(server, "agent-cli")
    assert ok(lmsp(server, "pair", "ls")).count(agent["user_code"]) == 1
    assert claim(server, agent["id"]).json()["error"]["code"] == "authorization_pending"
    approved = ok(
        lmsp(
            server, "pair", "approve", agent["user_code"], "--scopes", "responses:read,models:read"
        )
    )
    assert "approved" in approved and agent["user_code"] in approved
    grant = claim(server, agent["id"])
    assert grant.status_code == 200 and grant.json()["scopes"] == ["models:read", "responses:read"]
    double = claim(server, agent["id"])
    assert double.status_code == 400 and double.json()["error"]["code"] == "already_claimed"
    token = grant.json()["token"]
    assert (
        httpx.get(
            f"{server.url}/v1/models", headers={"Authorization": f"Bearer {token}"}
        ).status_code
        == 200
    )
    # the agent's token is not an admin's
    fails(lmsp(server, "pair", "ls", LMSP_TOKEN=token), "lacks the scope 'admin'")

    denied = request_pairing(server, "intruder")
    assert "denied" in ok(lmsp(server, "pair", "deny", denied["user_code"]))
    assert claim(server, denied["id"]).json()["error"]["code"] == "access_denied"
    fails(lmsp(server, "pair", "approve", denied["user_code"]), "denied already")

    late = request_pairing(server, "late")
    conn = open_db(server.data_dir)
    with conn:
        conn.execute(
            "UPDATE pairing_requests SET expires_at = ? WHERE id = ?",
            (int(time.time()) - 1, late["id"]),
        )
    conn.close()
    assert late["user_code"] not in ok(lmsp(server, "pair", "ls"))
    fails(lmsp(server, "pair", "approve", late["user_code"]), "expired")
    assert claim(server, late["id"]).json()["error"]["code"] == "expired_token"
    assert as_json(lmsp(server, "pair", "ls", "--json")) == []
    fails(lmsp(server, "pair", "approve", "ZZZZ-ZZZZ"), "No pairing request")


def test_clients_add_ls_revoke(server: Server) -> None:
    token = ok(
        lmsp(
            server,
            "clients",
            "add",
            "ci-bot",
            "--scopes",
            "responses:read",
            "--scopes",
            "responses:write",
        )
    ).strip()
    assert token.startswith("lmsp_")
    listed = as_json(lmsp(server, "clients", "ls", "--json"))
    bot = next(c for c in listed if c["name"] == "ci-bot")
    assert bot["scopes"] == ["responses:read", "responses:write"] and "token" not in bot
    assert ok(lmsp(server, "tasks", "ls", LMSP_TOKEN=token))
    table = ok(lmsp(server, "clients", "ls"))
    assert bot["id"] in table and token not in table and token[:11] in table
    assert bot["id"] in ok(lmsp(server, "clients", "revoke", bot["id"]))
    fails(lmsp(server, "tasks", "ls", LMSP_TOKEN=token), "was refused: unknown or revoked (")
    revoked = as_json(lmsp(server, "clients", "revoke", bot["id"], "--json"))
    assert revoked["revoked_at"] is not None
    fails(lmsp(server, "clients", "add", "x", "--scopes", "root"), "scopes")


def test_the_owner_lists_every_clients_tasks(server: Server) -> None:
    with server.client() as http:
        made = http.post(
            "/v1/clients",
            json={"name": "agent-x", "scopes": ["responses:read", "responses:write"]},
        )
        agent_id, agent = made.json()["id"], made.json()["token"]
        created = httpx.post(
            f"{server.url}/v1/responses",
            json={"model": "lmsp-test", "input": "agent work", "background": True},
            headers={"Authorization": f"Bearer {agent}"},
        ).json()
    task_id = created["task"]["id"]
    listed = as_json(lmsp(server, "tasks", "ls", "--json", "--client", agent_id))
    assert [t["id"] for t in listed] == [task_id] and listed[0]["client_id"] == agent_id
    table = ok(lmsp(server, "tasks", "ls", "--limit", "100"))
    assert "CLIENT" in table and "agent-x" in table and task_id in table
    # the agent sees its own tasks, without a client column, and not another's filter
    mine = ok(lmsp(server, "tasks", "ls", LMSP_TOKEN=agent))
    assert task_id in mine and "CLIENT" not in mine
    fails(lmsp(server, "tasks", "ls", "--client", "cli_other", LMSP_TOKEN=agent), "admin")
    stopped = ok(lmsp(server, "tasks", "cancel", task_id))  # the owner may stop it
    assert stopped.startswith(f"{task_id}: ")


def test_what_a_newcomer_tries(server: Server, tmp_path: Path) -> None:
    # global options before the command
    owner = server.token
    listed = lmsp(server, "--url", server.url, "--token", owner, "tasks", "ls", LMSP_URL=None)
    assert ok(listed)
    nowhere = f"http://127.0.0.1:{free_port()}"
    # the data directory's server runs elsewhere: its address, not "start one"
    fails(lmsp(server, "--url", nowhere, "tasks", "ls"), f"serves on {server.url}")
    fails(lmsp(server, "--url", nowhere, "models", "ls"), f"serves on {server.url}")
    # one error format: <message> (<code>), and a refused token says which one
    fails(lmsp(server, "tasks", "show", "task_missing"), "'task_missing'. (not_found)")
    fails(lmsp(server, "models", "rm", "nope"), "'nope'. (not_found)")
    fails(lmsp(server, "--token", "lmsp_wrong", "tasks", "ls"), "token from --token was refused")
    fails(lmsp(server, "tasks", "ls", LMSP_TOKEN="lmsp_wrong"), "token from LMSP_TOKEN was refused")
    # models add refuses a taken id or a file that is not GGUF before copying anything
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a model" * 100)
    refused = lmsp(server, "models", "add", str(junk), "--id", "junk")
    fails(refused, "(invalid_model_file)")
    assert "hashing" not in refused.stderr and "copying" not in refused.stderr
    model = next(p for p in (server.data_dir / "blobs").iterdir() if p.stat().st_size > 1000)
    taken = lmsp(server, "models", "add", str(model), "--id", "smollm2-135m-instruct")
    fails(taken, "A model 'smollm2-135m-instruct' exists. (model_exists)")
    assert "hashing" not in taken.stderr
    # help that is not cut mid-sentence
    helped = ok(lmsp(server, "pair", "--help"))
    assert "Approve a pending request by its CODE." in helped and "(e.g." not in helped
    # a task stopped by max_output_tokens: STATUS, --status and --json speak of the
    # task (completed), DETAIL and `show` say its response is incomplete
    cut = as_json(
        lmsp(server, "run", "short", "-m", "lmsp-test", "--max-output-tokens", "2", "--json")
    )
    assert cut["status"] == "incomplete" and cut["task"]["status"] == "completed"
    listed = as_json(lmsp(server, "tasks", "ls", "--status", "completed", "--json"))
    assert cut["task"]["id"] in [t["id"] for t in listed]
    assert all(t["status"] == "completed" for t in listed)
    table = ok(lmsp(server, "tasks", "ls", "--status", "completed", "--limit", "1"))
    row = next(line for line in table.splitlines() if cut["task"]["id"] in line)
    assert "│ completed" in row and "response incomplete (max_output_tokens)" in row
    assert "DETAIL" in table
    fails(lmsp(server, "tasks", "ls", "--status", "incomplete"), "(usage)")
    shown = ok(lmsp(server, "tasks", "show", cut["task"]["id"]))
    assert "response status" in shown and "incomplete" in shown
    # a token without models:read is told to name the model
    with server.client() as http:
        agent = http.post(
            "/v1/clients",
            json={"name": "no-models", "scopes": ["responses:read", "responses:write"]},
        ).json()["token"]
    fails(lmsp(server, "run", "x", LMSP_TOKEN=agent), "name the model with -m MODEL")
    assert ok(lmsp(server, "run", "x", "-m", "lmsp-test", LMSP_TOKEN=agent))


def test_errors_are_one_line(server: Server) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    fails(lmsp(server, "tasks", "ls", "--url", nowhere), f"cannot reach lmsp at {nowhere}")
    fails(lmsp(server, "run", "x", "--url", nowhere), "cannot reach lmsp")
    fails(lmsp(server, "tasks", "show", "task_missing"), "No task with id 'task_missing'")
    fails(lmsp(server, "tasks", "ls", "--token", "lmsp_wrong"), "was refused")
    fails(lmsp(server, "run", "x", "-m", "no-such-model"), "does not exist")
    usage = lmsp(server, "run", "x", "-m", "lmsp-test", "--on-restart", "never")
    assert usage.exit_code == 2 and "Error: Invalid value for '--on-restart'" in usage.stderr
    assert "Traceback" not in usage.output


def test_doctor_and_gc_on_a_data_directory(svc: Service, settings: Settings) -> None:
    runner = CliRunner()
    env = {"LMSP_DATA_DIR": str(settings.data_dir), "LMSP_URL": f"http://127.0.0.1:{free_port()}"}
    healthy = runner.invoke(main, ["doctor", "--json"], env=env)
    assert healthy.exit_code == 0, healthy.output
    report = json.loads(healthy.stdout)
    names = {c["name"]: c["status"] for c in report["checks"]}
    assert report["ok"] and names["database integrity"] == "ok"
    assert names["schema version"] == "ok" and names["owner token file"] == "ok"
    assert names["model lmsp-test"] == "ok" and names["service"] == "warn"
    summary = runner.invoke(main, ["doctor"], env=env).stdout  # the service is not running
    warned = sum(c["status"] == "warn" for c in report["checks"])
    assert "all checks passed" not in summary
    assert f"no check failed; {warned} warning(s) above" in summary

    token_file = settings.owner_token_path
    os.chmod(token_file, 0o644)
    blob = next(p for p in settings.blobs_dir.iterdir() if p.stat().st_size < 100)
    os.chmod(blob, stat.S_IRUSR | stat.S_IWUSR)
    original = blob.read_bytes()
    blob.write_bytes(original[:-1] + b"!")
    broken = runner.invoke(main, ["doctor", "--json"], env=env)
    assert broken.exit_code == 1
    failed = {c["name"] for c in json.loads(broken.stdout)["checks"] if c["status"] == "fail"}
    assert failed == {"owner token file", "model lmsp-test"}
    human = runner.invoke(main, ["doctor"], env=env)
    assert human.exit_code == 1 and "FAIL" in human.stdout and "Traceback" not in human.output
    blob.write_bytes(original)
    os.chmod(token_file, 0o600)

    held = runner.invoke(main, ["gc", "--data-dir", str(settings.data_dir)])
    assert held.exit_code == 1 and "in use by another lmsp process" in held.output
    svc.db.close()  # gc needs the directory to itself
    swept = runner.invoke(main, ["gc", "--data-dir", str(settings.data_dir)])
    assert swept.exit_code == 0 and "deleted" in swept.stdout
    missing = runner.invoke(
        main, ["doctor"], env=dict(env, LMSP_DATA_DIR=str(settings.data_dir / "nope"))
    )
    assert missing.exit_code == 1 and "no lmsp database" in missing.stdout
