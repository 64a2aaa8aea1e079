"""``lmsp console``: a one-time link that signs a browser in to the console."""

from __future__ import annotations

import webbrowser

import click

from lmsp.cli.remote import connect, print_json, remote_options


@click.command("console", short_help="Print a one-time login link to the browser console.")
@click.option("--open", "open_browser", is_flag=True, help="Open it in the default browser.")
@remote_options
def console(open_browser: bool, url: str | None, token: str | None, as_json: bool) -> None:
    """Print a one-time login link to the console in the browser (needs the owner's
    token). The link works once, for ten minutes; the browser tab that opens it is
    signed in while it stays open, for 12 hours at most, until it signs out or the
    service restarts."""
    with connect(url, token) as api:
        link = api.console_link()
    if as_json:
        print_json(link)
    else:
        click.echo(link["url"])
    if open_browser:
        webbrowser.open(link["url"])
