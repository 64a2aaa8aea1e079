"""``lmsp pair ls | approve CODE | deny CODE | clear``: the operator's side of pairing.

Everything a pairing request carries (its client name above all) is written by whoever
asked, without a token: it is shown escaped (:mod:`lmsp.cli.safe`), and the scopes it
asks for are shown in full, an ``admin`` request flagged."""

from __future__ import annotations

import time

import click
from rich.text import Text

from lmsp.cli.remote import (
    ask,
    console,
    note,
    remote_options,
    scopes_option,
    split_scopes,
    table,
)
from lmsp.cli.safe import clean
from lmsp.client import Client


@click.group("pair")
def pair() -> None:
    """Pairing requests from agents (device flow)."""


def _expires_in(stamp: int) -> str:
    left = max(0, stamp - int(time.time()))
    return f"{left // 60}m {left % 60:02d}s"


@pair.command("ls")
@remote_options
def list_requests(url: str | None, token: str | None, as_json: bool) -> None:
    """Pending pairing requests."""
    pending = ask(url, token, as_json, Client.pairings)
    if pending is None:
        return
    if not pending:
        click.echo("no pending pairing requests")
        return
    rows = [
        (
            p["user_code"],
            p["client_name"],
            _scopes(p["scopes"]),
            p.get("source") or "",
            _expires_in(p["expires_at"]),
            p["id"],
        )
        for p in pending
    ]
    table(None, ["CODE", "CLIENT", "SCOPES", "SOURCE", "EXPIRES IN", "ID"], rows)
    for p in pending:
        if "admin" in p["scopes"]:
            warning = Text(f"{p['user_code']} asks for ADMIN", style="bold red")
            warning.append(
                ": full control of the service, every client's data and tokens; approve"
                " it with --scopes to grant less",
                style="red",
            )
            console().print(warning)


def _scopes(scopes: list[str]) -> Text:
    """The requested scopes, ``admin`` first and flagged."""
    shown = Text()
    if "admin" in scopes:
        shown.append("ADMIN", style="bold red reverse")
    for scope in scopes:
        if scope != "admin":
            shown.append((" " if shown else "") + clean(scope))
    return shown


@pair.command("approve", short_help="Approve a pending request by its CODE.")
@click.argument("code")
@scopes_option(False, "Grant only these of the requested scopes.")
@remote_options
def approve(
    code: str, scopes: tuple[str, ...], url: str | None, token: str | None, as_json: bool
) -> None:
    """Approve the request showing CODE, like ABCD-EFGH (as `lmsp pair ls` lists it).

    Without --scopes the client gets every scope it asked for."""
    decided = ask(
        url, token, as_json, lambda api: api.approve_pairing(code, split_scopes(scopes) or None)
    )
    if decided is not None:
        granted = " ".join(decided["granted_scopes"])
        name = clean(decided["client_name"])
        click.echo(f"approved {decided['user_code']} ({name}): {clean(granted)}")
        if "admin" in decided["granted_scopes"]:
            note("this client holds admin: it can do anything the owner can")


@pair.command("deny")
@click.argument("code")
@remote_options
def deny(code: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Deny the request showing CODE."""
    decided = ask(url, token, as_json, lambda api: api.deny_pairing(code))
    if decided is not None:
        click.echo(f"denied {decided['user_code']} ({clean(decided['client_name'])})")


@pair.command("clear", short_help="Deny every pending request (or one source's).")
@click.option("--source", help="Only the requests from this address (as `pair ls` shows).")
@remote_options
def clear(source: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """Deny every pending request (or those of one source), freeing their slots."""
    denied = ask(url, token, as_json, lambda api: api.clear_pairings(source))
    if denied is None:
        return
    where = f" from {clean(source)}" if source else ""
    click.echo(f"denied {len(denied)} pending pairing request(s){where}")
