"""``lmsp models alias`` (another name for a model) and ``lmsp logs --errors`` (the
recent refused requests, with their client)."""

from __future__ import annotations

import click

from lmsp.cli.models import models
from lmsp.cli.remote import ask, connect, limit_option, print_json, remote_options, table, when
from lmsp.cli.safe import clean


@models.command("alias", short_help="Give a model another name (or list, or --rm one).")
@click.argument("name", required=False)
@click.argument("model_id", required=False)
@click.option("--rm", "remove", is_flag=True, help="Delete the alias NAME.")
@remote_options
def alias(
    name: str | None,
    model_id: str | None,
    remove: bool,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """NAME MODEL: requests naming NAME run on MODEL (a client with a fixed model
    name, e.g. gpt-4o-mini, claude-sonnet-4-5 or text-embedding-3-small, then works).
    Without arguments: the aliases there are."""
    with connect(url, token) as api:
        if name is None:
            result = api.request("GET", "/v1/model_aliases")
        elif remove:
            result = api.request("DELETE", f"/v1/model_aliases/{name}")
        elif model_id is None:
            raise click.UsageError("name the model the alias stands for: alias NAME MODEL")
        else:
            result = api.request("PUT", f"/v1/model_aliases/{name}", json={"model": model_id})
    if as_json:
        print_json(result)
    elif name is None:
        rows = [[a["alias"], a["model"], when(a["created_at"])] for a in result["data"]]
        table(None, ["ALIAS", "MODEL", "CREATED"], rows)
    elif remove:
        click.echo(f"deleted alias {clean(name)}")
    else:
        click.echo(f"{clean(result['alias'])} -> {clean(result['model'])}")


@click.command(short_help="Show the recent refused requests, with their client.")
@click.option(
    "--errors", "errors_only", is_flag=True, help="The recent 4xx/5xx answers (the default)."
)
@limit_option(256, 50)
@remote_options
def logs(errors_only: bool, limit: int, url: str | None, token: str | None, as_json: bool) -> None:
    """The refused requests the service keeps in memory (newest first): status, error
    code, param, client and its user agent. The whole log goes to the service's stderr
    (LMSP_LOG_FORMAT=json for JSON lines)."""
    del errors_only  # the refusals are the one log kept here: --errors says so
    result = ask(
        url, token, as_json, lambda api: api.request("GET", "/v1/refusals", params={"limit": limit})
    )
    if result is None:
        return
    rows = [
        [
            when(int(r["at"])),
            r["status"],
            r["code"] or "-",
            r["param"] or "-",
            f"{r['method']} {r['path']}",
            r["client_id"] or "-",
            (r["user_agent"] or "-")[:40],
        ]
        for r in result["data"]
    ]
    table(None, ["TIME", "STATUS", "CODE", "PARAM", "REQUEST", "CLIENT", "USER AGENT"], rows)
