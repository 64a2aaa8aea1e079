"""``lmsp tasks ls | show ID | follow ID | cancel ID``."""

from __future__ import annotations

from typing import Any

import click

from lmsp.cli import mcploop
from lmsp.cli.remote import (
    connect,
    console,
    finish,
    limit_option,
    print_json,
    print_stream,
    remote_options,
    table,
    when,
)
from lmsp.cli.safe import clean
from lmsp.client import Client
from lmsp.protocol.states import Status

#: the task states (PROTOCOL.md section 5), the one vocabulary of STATUS and --status
STATUSES = [status.value for status in Status]


@click.group("tasks")
def tasks() -> None:
    """Your tasks on the running service."""


def _error(task: dict[str, Any]) -> str:
    error = task.get("error")
    return f"{error['code']}: {error['message']}" if error else ""


def _client_names(api: Client, page: list[dict[str, Any]]) -> dict[str, str]:
    """Client id → name, for an owner's listing (which names every task's client)."""
    if not any("client_id" in t for t in page):
        return {}
    return {c["id"]: c["name"] for c in api.clients()}


def _incomplete(response: dict[str, Any]) -> str:
    """What a completed task's response says when it stopped short (its status
    ``incomplete``), else ``""``."""
    if response.get("status") != "incomplete":
        return ""
    reason = (response.get("incomplete_details") or {}).get("reason") or "stopped short"
    return f"response incomplete ({reason})"


def _details(api: Client, page: list[dict[str, Any]]) -> dict[str, str]:
    """Task id → the DETAIL column: a failed task's error; for a completed task whose
    response stopped at ``max_output_tokens``, that (the task itself only says
    ``completed``: task states are one vocabulary, response states another)."""
    shown: dict[str, str] = {}
    for task in page:
        if task["status"] == "completed":
            shown[task["id"]] = _incomplete(api.retrieve(task["response_id"]))
        else:
            shown[task["id"]] = _error(task)
    return shown


@tasks.command("ls", short_help="List tasks, newest first.")
@click.option(
    "--status", type=click.Choice(STATUSES), help="Only tasks in this state (the STATUS column)."
)
@limit_option(100, 20)
@click.option(
    "--client",
    "client_id",
    metavar="CLIENT_ID",
    help="Only this client's tasks (the owner sees every client's; see `lmsp clients ls`).",
)
@remote_options
def list_tasks(
    status: str | None,
    limit: int,
    client_id: str | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """List tasks, newest first: your own, or every client's with the owner's token.

    STATUS is the task's state, the one --status selects and --json prints; DETAIL
    says why a task failed, or that its response stopped at max_output_tokens (the
    response's status `incomplete`)."""
    with connect(url, token) as api:
        page = api.tasks(status=status, limit=limit, client_id=client_id)
        names = _client_names(api, page["data"])
        details = {} if as_json else _details(api, page["data"])
    if as_json:
        print_json(page["data"])
        return
    owner_view = any("client_id" in t for t in page["data"])
    rows = []
    for t in page["data"]:
        row: list[Any] = [t["id"], t["status"]]
        if owner_view:
            row.append(names.get(t["client_id"], t["client_id"]))
        row += [
            t["response_id"],
            t["attempt"],
            t["on_restart"],
            when(t["created_at"]),
            t["queue_position"] or "",
            details[t["id"]],
        ]
        rows.append(tuple(row))
    columns = ["TASK", "STATUS", *(["CLIENT"] if owner_view else [])]
    columns += ["RESPONSE", "ATTEMPT", "ON RESTART", "CREATED", "QUEUE", "DETAIL"]
    table(None, columns, rows)
    if page.get("has_more"):
        click.echo("… more with --limit (up to 100)", err=True)


def _resolve(api: Client, ident: str) -> dict[str, Any]:
    """A task by its id, or by its response's id."""
    if ident.startswith("resp_"):
        return api.task(api.retrieve(ident)["task"]["id"])
    return api.task(ident)


def _text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response.get("output", [])
        for part in item.get("content") or []  # a tool call or an MCP item has none
    )


@tasks.command("show", short_help="Show a task and its output so far.")
@click.argument("task_id")
@remote_options
def show(task_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Show a task (TASK_ID may also be its response id) and its output so far."""
    with connect(url, token) as api:
        task = _resolve(api, task_id)
        response = api.retrieve(task["response_id"])
    if as_json:
        print_json({"task": task, "response": response})
        return
    fields = [
        ("task", task["id"]),
        ("response", task["response_id"]),
        ("status", task["status"]),
        ("response status", response["status"]),
        ("model", response["model"]),
        ("model digest", response.get("model_digest") or "-"),
        ("on restart", task["on_restart"]),
        ("attempt", task["attempt"]),
        ("created", when(task["created_at"])),
        ("finished", when(task["finished_at"])),
        ("last event", task["last_sequence_number"]),
    ]
    if task["queue_position"]:
        fields.append(("queue position", task["queue_position"]))
    if task.get("error"):
        fields.append(("error", _error(task)))
    if _incomplete(response):
        fields.append(("detail", _incomplete(response)))
    usage = response.get("usage")
    if usage:
        fields.append(("tokens", f"{usage['input_tokens']} in, {usage['output_tokens']} out"))
    table(None, ["FIELD", "VALUE"], fields)
    mcploop.show(response)  # its MCP tool loop, if any
    text = _text(response)
    if text:
        console().print(clean(text, multiline=True), markup=False, highlight=False)


@tasks.command("follow", short_help="Print a task's text live until it finishes.")
@click.argument("task_id")
@click.option(
    "--after", type=click.IntRange(min=-1), default=-1, help="Start after this sequence number."
)
@remote_options
def follow(task_id: str, after: int, url: str | None, token: str | None, as_json: bool) -> None:
    """Print a task's text from the start (or --after N) and live until it finishes.

    A dropped connection or a server restart is survived: the stream resumes from the
    last sequence number seen. With --json, every event is one JSON line.
    """
    with connect(url, token) as api:
        resolved = _resolve(api, task_id)
        terminal = print_stream(api.follow_task(resolved["id"], after), as_json)
    if not as_json:
        finish(terminal)


@tasks.command("cancel")
@click.argument("task_id")
@remote_options
def cancel(task_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Cancel a task (a finished one is left as it is)."""
    with connect(url, token) as api:
        task = api.cancel_task(_resolve(api, task_id)["id"])
    if as_json:
        print_json(task)
    else:
        click.echo(f"{task['id']}: {task['status']}")
