"""``lmsp pair ls | approve CODE | deny CODE``: the operator's side of pairing."""

from __future__ import annotations

import time

import click

from .remote import (
    connect,
    print_json,
    remote_options,
    scopes_option,
    split_scopes,
    table,
)


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
    with connect(url, token) as api:
        pending = api.pairings()
    if as_json:
        print_json(pending)
        return
    if not pending:
        click.echo("no pending pairing requests")
        return
    rows = [
        (
            p["user_code"],
            p["client_name"],
            " ".join(p["scopes"]),
            _expires_in(p["expires_at"]),
            p["id"],
        )
        for p in pending
    ]
    table(None, ["CODE", "CLIENT", "SCOPES", "EXPIRES IN", "ID"], rows)


@pair.command("approve")
@click.argument("code")
@scopes_option(False, "Grant only these of the requested scopes.")
@remote_options
def approve(
    code: str, scopes: tuple[str, ...], url: str | None, token: str | None, as_json: bool
) -> None:
    """Approve the request showing CODE (e.g. ABCD-EFGH)."""
    with connect(url, token) as api:
        decided = api.approve_pairing(code, split_scopes(scopes) or None)
    if as_json:
        print_json(decided)
    else:
        granted = " ".join(decided["granted_scopes"])
        click.echo(f"approved {decided['user_code']} ({decided['client_name']}): {granted}")


@pair.command("deny")
@click.argument("code")
@remote_options
def deny(code: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Deny the request showing CODE."""
    with connect(url, token) as api:
        decided = api.deny_pairing(code)
    if as_json:
        print_json(decided)
    else:
        click.echo(f"denied {decided['user_code']} ({decided['client_name']})")
