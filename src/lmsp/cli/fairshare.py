"""``lmsp clients limit NAME …``, ``lmsp clients usage`` and ``lmsp audit``
(PROTOCOL.md 13)."""

from __future__ import annotations

import calendar
import time
from typing import Any

import click

from lmsp.cli.errors import CliError
from lmsp.cli.remote import connect, limit_option, note, print_json, remote_options, table, when
from lmsp.cli.safe import clean
from lmsp.client import Client

LIFT = ("none", "off", "null", "-")


def _limit(value: str | None, name: str) -> tuple[bool, int | None]:
    """``(given, value)``: a whole number of at least 1, or ``none`` to lift it."""
    if value is None:
        return False, None
    if value.strip().lower() in LIFT:
        return True, None
    if not value.strip().isdigit() or int(value) < 1:
        raise CliError(
            f"--{name.replace('_', '-')}: a whole number of at least 1, or none", "invalid_value"
        )
    return True, int(value)


def find_client(api: Client, name: str) -> dict[str, Any]:
    """An unrevoked client by id or by name (a name two clients share is refused)."""
    rows = [c for c in api.clients() if c["revoked_at"] is None]
    by_id = [c for c in rows if c["id"] == name]
    if by_id:
        return by_id[0]
    named = [c for c in rows if c["name"] == name]
    if not named:
        raise CliError(f"no client named {clean(name)!r} (see `lmsp clients ls`)", "not_found")
    if len(named) > 1:
        ids = ", ".join(c["id"] for c in named)
        raise CliError(f"several clients are named {clean(name)!r}: use an id ({ids})", "ambiguous")
    return named[0]


def _shown(limits: dict[str, Any]) -> str:
    return " ".join(f"{k}={'-' if v is None else v}" for k, v in limits.items())


@click.command("limit", short_help="Set or lift a client's limits (no option: show them).")
@click.argument("name")
@click.option("--max-queued", help="Unfinished tasks it may hold at once (none: no limit).")
@click.option("--max-running", help="Its tasks that may run at once (none: no limit).")
@click.option("--tokens-per-minute", help="Prompt+output tokens per UTC minute (none: no limit).")
@click.option("--tokens-per-day", help="Prompt+output tokens per UTC day (none: no limit).")
@remote_options
def limit(
    name: str,
    max_queued: str | None,
    max_running: str | None,
    tokens_per_minute: str | None,
    tokens_per_day: str | None,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Set (or with `none` lift) a client's limits; with no option, show them.

    A request over a limit gets 429 rate_limit_exceeded with Retry-After and writes
    nothing. The owner is never limited."""
    given = {
        "max_queued": _limit(max_queued, "max_queued"),
        "max_running": _limit(max_running, "max_running"),
        "tokens_per_minute": _limit(tokens_per_minute, "tokens_per_minute"),
        "tokens_per_day": _limit(tokens_per_day, "tokens_per_day"),
    }
    changes = {key: value for key, (present, value) in given.items() if present}
    with connect(url, token) as api:
        found = find_client(api, name)
        if changes:
            found = api.request("PATCH", f"/v1/clients/{found['id']}", json={"limits": changes})
    if as_json:
        print_json(found)
        return
    click.echo(f"{found['id']} ({clean(found['name'])}): {_shown(found['limits'])}")


def _stamp(text: str | None, end: bool) -> int | None:
    """``YYYY-MM-DD`` (a UTC day: its first or last second) or Unix seconds."""
    if text is None:
        return None
    if text.isdigit():
        return int(text)
    try:
        day = calendar.timegm(time.strptime(text, "%Y-%m-%d"))
    except ValueError:
        raise CliError(
            f"{text!r}: a date (YYYY-MM-DD, UTC) or Unix seconds", "invalid_value"
        ) from None
    return day + 86399 if end else day


@click.command("usage", short_help="Requests and tokens per client, from the usage ledger.")
@click.argument("name", required=False)
@click.option("--since", help="From this UTC day (YYYY-MM-DD) or Unix time.")
@click.option("--until", help="Up to this UTC day (YYYY-MM-DD) or Unix time.")
@click.option(
    "--by",
    "group_by",
    type=click.Choice(["day", "model", "total"]),
    default="day",
    show_default=True,
    help="One row per client and day, per client and model, or per client.",
)
@remote_options
def usage(
    name: str | None,
    since: str | None,
    until: str | None,
    group_by: str,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Requests and tokens per client (every client's with the owner's token, or NAME's)."""
    # totals are summed here from the rows per day
    params: dict[str, Any] = {"group_by": ["day" if group_by == "total" else group_by]}
    for key, value in (("since", _stamp(since, False)), ("until", _stamp(until, True))):
        if value is not None:
            params[key] = value
    with connect(url, token) as api:
        if name is not None:
            params["client_id"] = find_client(api, name)["id"]
        rows: list[dict[str, Any]] = api.request("GET", "/v1/usage", params=params)["data"]
    if group_by == "total":
        rows = _totals(rows)
    if as_json:
        print_json(rows)
        return
    key = {"day": "DAY", "model": "MODEL"}.get(group_by, "")
    columns = ["CLIENT", *([key] if key else []), "REQUESTS", "INPUT", "CACHED", "OUTPUT"]
    table(
        None,
        columns,
        [
            (
                f"{r['client_name'] or ''} {r['client_id']}",
                *([r[group_by]] if key else []),
                r["requests"],
                r["input_tokens"],
                r["cached_tokens"],
                r["output_tokens"],
            )
            for r in rows
        ],
    )
    if not rows:
        note("no finished request in this period")


def _totals(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    summed: dict[str, dict[str, Any]] = {}
    for row in rows:
        into = summed.setdefault(
            row["client_id"],
            {
                "client_id": row["client_id"],
                "client_name": row["client_name"],
                "requests": 0,
                "input_tokens": 0,
                "cached_tokens": 0,
                "output_tokens": 0,
            },
        )
        for name in ("requests", "input_tokens", "cached_tokens", "output_tokens"):
            into[name] += row[name]
    return list(summed.values())


@click.command("audit", short_help="The audit log of owner and admin actions.")
@click.option("--after", type=int, default=0, help="Rows after this id.")
@limit_option(1000, 100, "count")
@click.option("--target", help="Only rows about this client, pairing or model id.")
@remote_options
def audit(
    after: int, count: int, target: str | None, url: str | None, token: str | None, as_json: bool
) -> None:
    """The audit log: every owner or admin action, oldest first (`lmsp doctor` checks
    its hash chain)."""
    params: dict[str, Any] = {"after": after, "limit": count}
    if target is not None:
        params["target"] = target
    with connect(url, token) as api:
        page = api.request("GET", "/v1/audit", params=params)
    rows = page["data"]
    if as_json:
        print_json(rows)
        return
    table(
        None,
        ["ID", "TIME", "ACTOR", "ACTION", "TARGET", "CHANGE"],
        [
            (r["id"], when(r["at"]), r["actor"], r["action"], r["target"], _change(r["change"]))
            for r in rows
        ],
    )
    if page.get("has_more"):
        note(f"more after id {page['last_id']} (--after {page['last_id']})")


def _change(change: dict[str, Any]) -> str:
    if set(change) == {"before", "after"} and isinstance(change["before"], dict):
        moved = [
            f"{k}: {change['before'].get(k)} → {v}"
            for k, v in change["after"].items()
            if change["before"].get(k) != v
        ]
        return ", ".join(moved)
    return ", ".join(f"{k}={v}" for k, v in change.items())
