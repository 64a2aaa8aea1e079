"""``lmsp ps``: what the running service does now (like ``ollama ps``), ``--watch`` live."""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from lmsp.cli.remote import connect, console, handled, print_json, remote_options, size, when
from lmsp.cli.safe import clean


def _table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    out = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        out.add_column(name, no_wrap=name in {"MODEL", "TASK", "CLIENT", "DIGEST"})
    for row in rows:
        out.add_row(*(escape(clean(v)) for v in row))
    if not rows:
        out.add_row(*(["-"] + [""] * (len(columns) - 1)))
    return out


def _prompt(seq: dict[str, Any]) -> str:
    """A sequence's prompt: its size, and while its engine reads it, how far and how
    fast (``3,072/10,153 read, 812/s``)."""
    total = seq.get("prompt_total") or seq["prompt_tokens"]
    if seq.get("phase") != "reading":
        return f"{seq['prompt_tokens']:,}"
    if not seq.get("prompt_total"):
        return f"{total:,} (reading)"
    rate = seq.get("prompt_tokens_per_second")
    speed = "" if rate is None else f", {rate:,.0f}/s"
    return f"{seq['prompt_read']:,}/{total:,} read{speed}"


def _tables(state: dict[str, Any], names: dict[str, str]) -> list[Table | str]:
    """Models, engines that failed, sequences and the queue: always shown."""
    models = [
        [
            m["model"],
            "-" if m.get("pid") is None else m["pid"],
            m.get("restarts", 0),
            m["digest"][:12],
            size(m["memory_bytes"]),
            "in use" if m["busy"] else f"idle, unloads in {m['unloads_in']:.0f}s",
        ]
        for m in state["models"]
    ]
    sequences = [
        [
            *_task(s, names),
            _prompt(s),
            s["output_tokens"],
            "-" if s["tokens_per_second"] is None else f"{s['tokens_per_second']:.1f}",
            when(s["started_at"]),
            s.get("reason") or "",
        ]
        for s in state["sequences"]
    ]
    queue = state["queue"]
    oldest = when(queue["oldest_created_at"]) if queue["queued"] else "-"
    failed = [e for e in state.get("engines", []) if e["state"] == "failed"]
    return [
        _table("Models loaded", ["MODEL", "PID", "RESTARTS", "DIGEST", "MEMORY", "STATE"], models),
        *(escape(clean(f"Failed: {e['model']}: {e['error']}")) for e in failed),
        _table(
            f"Sequences ({len(sequences)} of {state['parallel']} at once)",
            [*TASK, "PROMPT", "OUTPUT", "TOKENS/S", "STARTED", "WHY SLOWER"],
            sequences,
        ),
        f"Queue: {queue['queued']} task(s) waiting, oldest since {oldest}",
    ]


#: the columns :func:`_task` fills
TASK = ["TASK", "MODEL", "CLIENT", "STATUS"]


def _task(row: dict[str, Any], names: dict[str, str]) -> list[Any]:
    """A sequence's or a waiting task's first cells: task, model, client, status."""
    client = names.get(row["client_id"], row["client_id"])
    return [row["task_id"], row["model"], client, row["status"]]


def _waiting(state: dict[str, Any], names: dict[str, str]) -> list[Table]:
    """The first tasks of the queue and why each waits (none: no table)."""
    rows = [
        [*_task(w, names), when(w["created_at"]), w["reason"]] for w in state.get("waiting", [])
    ]
    return [_table("Waiting", [*TASK, "SINCE", "WHY"], rows)] if rows else []


def _nodes(state: dict[str, Any]) -> list[Table]:
    """A database nodes share: every node, its lease and its unfinished tasks."""
    rows = [
        [
            n["id"] + (" (this node)" if n["id"] == state.get("node") else ""),
            n["address"],
            n["status"],
            n["epoch"],
            f"{n['lease_seconds_left']:.1f}s" if n["status"] == "up" else "-",
            "-" if n.get("clock_skew_seconds") is None else f"{n['clock_skew_seconds']:+.3f}s",
            n["unfinished"],
            " ".join(t["id"] for t in n.get("tasks", [])[:4])
            + (" …" if len(n.get("tasks", [])) > 4 else ""),
        ]
        for n in state.get("nodes", [])
    ]
    columns = ["NODE", "ADDRESS", "STATE", "EPOCH", "LEASE", "SKEW", "UNFINISHED", "TASKS"]
    return [_table("Nodes", columns, rows)] if rows else []


def _pulls(state: dict[str, Any]) -> list[Table]:
    """Models being pulled from the hub."""
    rows = [
        [
            p["task_id"],
            p["model"],
            p["status"],
            size(p["bytes"]),
            size(p["total"]),
            f"{100 * p['bytes'] / p['total']:.0f}" if p["total"] else "-",
        ]
        for p in state.get("pulls", [])
    ]
    return [_table("Pulls", ["TASK", "MODEL", "STATUS", "DONE", "OF", "%"], rows)] if rows else []


def render(state: dict[str, Any]) -> Group:
    """The tables of ``lmsp ps``: models, sequences, the queue (and the first tasks
    waiting), clients with unfinished work, and the nodes and pulls when there are any."""
    names = {c["id"]: c["name"] for c in state["clients"]}
    clients = [
        [c["name"], c["id"], c["running"], c["queued"], when(c["last_used_at"])]
        for c in state["clients"]
    ]
    return Group(
        *_tables(state, names),
        *_waiting(state, names),
        _table(
            "Clients with unfinished work",
            ["CLIENT", "ID", "RUNNING", "QUEUED", "LAST SEEN"],
            clients,
        ),
        *_nodes(state),
        *_pulls(state),
    )


@click.command("ps", short_help="Loaded models, running sequences, the queue, busy clients.")
@click.option("--watch", is_flag=True, help="Refresh live until Ctrl-C.")
@click.option(
    "--interval",
    type=click.FloatRange(0.2, 60),
    default=1.0,
    show_default=True,
    help="Seconds between refreshes with --watch.",
)
@remote_options
def ps(watch: bool, interval: float, url: str | None, token: str | None, as_json: bool) -> None:
    """What the service is doing now: loaded models with their engine process and
    memory (and models whose engine kept crashing), the sequences
    being generated and their speed (a prompt being read: how far and how fast; what
    slows a sequence), the queue and why its first tasks wait, and the clients with
    unfinished work (needs the owner's token)."""
    with connect(url, token) as api:
        if not watch:
            state = api.activity()
            if as_json:
                print_json(state)
            else:
                console().print(render(state))
            return
        if as_json:
            raise click.UsageError("--watch shows tables: use --json without --watch")
        out = console()
        try:
            if not out.is_terminal:  # a pipe or a file: one snapshot after another
                while True:
                    out.print(f"-- {when(int(time.time()))}")
                    out.print(render(api.activity()))
                    time.sleep(interval)
            with Live(render(api.activity()), console=out, auto_refresh=False) as live:
                while True:
                    time.sleep(interval)
                    with handled():
                        live.update(render(api.activity()), refresh=True)
        except KeyboardInterrupt:
            return
