"""``lmsp webhooks add URL | ls | update ID | rotate ID | rm ID | deliveries ID``
(docs/webhooks.md)."""

from __future__ import annotations

from typing import Any

import click

from lmsp.cli.remote import (
    ask,
    connect,
    limit_option,
    note,
    print_json,
    remote_options,
    table,
    when,
)
from lmsp.protocol.webhooks import EVENTS

EVENT_OPTION = click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice(EVENTS),
    help="An event to hear (repeat it): `add` without it hears all four ends of a"
    " response; with `update` the events given replace the webhook's.",
)


@click.group("webhooks")
def webhooks() -> None:
    """Webhooks: be told when your responses end, instead of polling."""


@webhooks.command("add", short_help="Register URL; its signing secret is printed once.")
@click.argument("hook_url", metavar="URL")
@EVENT_OPTION
@click.option("--description", help="A note for whoever reads the list.")
@click.option(
    "--all-clients", is_flag=True, help="Hear every client's responses (admin tokens only)."
)
@remote_options
def add(
    hook_url: str,
    events: tuple[str, ...],
    description: str | None,
    all_clients: bool,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Register URL; its signing secret (whsec_…) is printed once and never again."""
    body: dict[str, Any] = {"url": hook_url, "events": list(events or EVENTS)}
    if description:
        body["description"] = description
    if all_clients:
        body["all_clients"] = True
    with connect(url, token) as api:
        created: dict[str, Any] = api.request("POST", "/v1/webhooks", json=body)
    said = f"webhook {created['id']} → {created['url']}: {' '.join(created['events'])}"
    _show_secret(created, created["secret"], said, as_json)


@webhooks.command("ls")
@remote_options
def list_webhooks(url: str | None, token: str | None, as_json: bool) -> None:
    """Your webhooks (an admin token: every client's)."""
    rows = ask(url, token, as_json, lambda api: api.request("GET", "/v1/webhooks")["data"])
    if rows is None:
        return
    table(
        None,
        ["ID", "URL", "EVENTS", "CLIENT", "CREATED", "DESCRIPTION"],
        [
            (
                h["id"],
                h["url"],
                " ".join(e.removeprefix("response.") for e in h["events"]),
                ("all" if h["all_clients"] else h.get("client_id", "")),
                when(h["created_at"]),
                h["description"] or "",
            )
            for h in rows
        ],
    )


@webhooks.command("update", short_help="Change a webhook's URL, events or description.")
@click.argument("webhook_id")
@click.option("--to", "hook_url", metavar="URL", help="Where its deliveries go from now on.")
@EVENT_OPTION
@click.option("--description", help="A note for whoever reads the list.")
@remote_options
def update(
    webhook_id: str,
    hook_url: str | None,
    events: tuple[str, ...],
    description: str | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Change what is given (pending deliveries go to the new URL); the rest stays. With
    nothing given it shows the webhook as it is."""
    body: dict[str, Any] = {}
    if hook_url is not None:
        body["url"] = hook_url
    if events:
        body["event_types"] = list(events)
    if description is not None:
        body["name"] = description
    path = f"/v1/webhook_endpoints/{webhook_id}"
    changed = ask(url, token, as_json, lambda api: api.request("POST", path, json=body))
    if changed is None:
        return
    note(f"webhook {changed['id']} → {changed['url']}: {' '.join(changed['event_types'])}")


@webhooks.command("rotate", short_help="A new signing secret, printed once; the old one stops.")
@click.argument("webhook_id")
@remote_options
def rotate(webhook_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Give the webhook a new signing secret (whsec_…), printed once and never again; the
    old one signs nothing from now on."""
    with connect(url, token) as api:
        rotated: dict[str, Any] = api.request(
            "POST", f"/v1/webhook_endpoints/{webhook_id}/rotate_secret"
        )
    said = f"webhook {rotated['id']}: the old secret signs nothing from now on"
    _show_secret(rotated, rotated["signing_secret"], said, as_json)


def _show_secret(answer: dict[str, Any], secret: str, said: str, as_json: bool) -> None:
    """A new secret on stdout (or the whole answer as JSON), what happened on stderr."""
    if as_json:
        print_json(answer)
        return
    click.echo(secret)
    note(said)
    note("the secret above is shown once; verify deliveries with it (docs/webhooks.md)")


@webhooks.command("rm")
@click.argument("webhook_id")
@remote_options
def remove(webhook_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Remove a webhook (its pending deliveries are not sent)."""
    gone = ask(url, token, as_json, lambda api: api.request("DELETE", f"/v1/webhooks/{webhook_id}"))
    if gone is not None:
        click.echo(f"removed {webhook_id}")


@webhooks.command("deliveries", short_help="A webhook's recent deliveries and their state.")
@click.argument("webhook_id")
@limit_option(100, 20)
@remote_options
def list_deliveries(
    webhook_id: str, limit: int, url: str | None, token: str | None, as_json: bool
) -> None:
    """A webhook's recent deliveries: event, status, tries, next try, last error."""
    with connect(url, token) as api:
        page = api.request("GET", f"/v1/webhooks/{webhook_id}/deliveries", params={"limit": limit})
    rows: list[dict[str, Any]] = page["data"]
    if as_json:
        print_json(rows)
        return

    def stamp(value: float | None) -> str:
        return when(None if value is None else int(value))

    table(
        None,
        ["EVENT", "TYPE", "RESPONSE", "STATUS", "TRIES", "NEXT TRY", "LAST"],
        [
            (
                d["id"],
                d["type"],
                d["response_id"],
                d["status"],
                str(d["attempts"]),
                stamp(d["next_attempt_at"]) if d["status"] == "pending" else "",
                d["last_error"] or (str(d["last_status_code"] or "")),
            )
            for d in rows
        ],
    )
