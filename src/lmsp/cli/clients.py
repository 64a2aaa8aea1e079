"""``lmsp clients ls | add NAME --scopes … | revoke ID``."""

from __future__ import annotations

import click

from lmsp.cli.remote import (
    ask,
    note,
    remote_options,
    scopes_option,
    split_scopes,
    table,
    when,
)
from lmsp.cli.safe import clean
from lmsp.client import Client


@click.group("clients")
def clients() -> None:
    """Clients (agents) allowed to use the service, and their tokens."""


@clients.command("ls")
@remote_options
def list_clients(url: str | None, token: str | None, as_json: bool) -> None:
    """Every client, revoked ones too."""
    rows = ask(url, token, as_json, Client.clients)
    if rows is None:
        return
    table(
        None,
        ["ID", "NAME", "TOKEN PREFIX", "SCOPES", "CREATED", "LAST USED", "REVOKED"],
        [
            (
                c["id"],
                c["name"],
                c["token_prefix"] + "…",
                " ".join(c["scopes"]),
                when(c["created_at"]),
                when(c["last_used_at"]),
                when(c["revoked_at"]) if c["revoked_at"] else "",
            )
            for c in rows
        ],
    )


@clients.command("add")
@click.argument("name")
@scopes_option(True, "Scopes: models:read models:write responses:read responses:write admin.")
@remote_options
def add(
    name: str, scopes: tuple[str, ...], url: str | None, token: str | None, as_json: bool
) -> None:
    """Create a client; its token is printed once and never again."""
    created = ask(url, token, as_json, lambda api: api.add_client(name, split_scopes(scopes)))
    if created is None:
        return
    click.echo(created["token"])
    note(f"client {created['id']} ({name}): {' '.join(created['scopes'])}")  # note() cleans
    note("the token above is shown once; lmsp keeps only its hash")


@clients.command("revoke")
@click.argument("client_id")
@remote_options
def revoke(client_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Revoke a client and cancel its unfinished tasks.

    Its token stops working at once and its queued and running tasks are cancelled;
    its finished tasks stay."""
    revoked = ask(url, token, as_json, lambda api: api.revoke_client(client_id))
    if revoked is not None:
        cancelled = len(revoked.get("cancelled_tasks") or [])
        click.echo(
            f"revoked {revoked['id']} ({clean(revoked['name'])}); cancelled {cancelled} task(s)"
        )
