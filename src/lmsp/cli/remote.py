"""What the commands that talk to a running server share: connection options, one-line
errors, ``--json`` output, rich tables and printing a response's text as it streams."""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from lmsp.client import APIError, Client, ClientError, UnreachableError

from .common import START_HINT, Target, api_error_line, target
from .safe import clean, clean_json

F = TypeVar("F", bound=Callable[..., Any])


def remote_options(func: F) -> F:
    """``--url``, ``--token`` and ``--json`` for a command that talks to the server."""
    func = click.option(
        "--json", "as_json", is_flag=True, help="Print JSON for scripts instead of tables."
    )(func)
    func = click.option(
        "--token", help="Bearer token (LMSP_TOKEN; default: the data directory's owner token)."
    )(func)
    func = click.option("--url", help="Service address (LMSP_URL; default http://127.0.0.1:8430).")(
        func
    )
    return func


def _message(exc: ClientError, where: Target | None) -> str:
    if isinstance(exc, APIError):
        return api_error_line(exc.status, exc.code, exc.message, where)
    if isinstance(exc, UnreachableError):
        return f"{clean(exc)} ({START_HINT})"
    return clean(exc)


@contextlib.contextmanager
def handled(where: Target | None = None) -> Iterator[None]:
    """Turn client errors into one clear line and a non-zero exit, never a traceback."""
    try:
        yield
    except ClientError as exc:
        raise click.ClickException(_message(exc, where)) from None
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@contextlib.contextmanager
def connect(url: str | None, token: str | None) -> Iterator[Client]:
    where = target(url, token)
    with handled(where), Client(where.url, where.token) as api:
        yield api


def console() -> Console:
    """A console on the current stdout (wide when it is not a terminal, so ids never wrap)."""
    return Console(file=sys.stdout, width=None if sys.stdout.isatty() else 200)


def print_json(obj: Any) -> None:
    click.echo(clean_json(obj))


def table(title: str | None, columns: Iterable[str], rows: Iterable[Iterable[Any]]) -> None:
    out = Table(title=title, title_justify="left", header_style="bold")
    for name in columns:
        out.add_column(name, no_wrap=name in {"ID", "TASK", "RESPONSE", "CODE", "TOKEN PREFIX"})
    for row in rows:
        out.add_row(*(v if isinstance(v, Text) else escape(clean(v)) for v in row))
    console().print(out)


def when(stamp: int | None) -> str:
    if stamp is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(stamp))


def scopes_option(required: bool, help_text: str) -> Callable[[F], F]:
    return click.option(
        "--scopes",
        multiple=True,
        required=required,
        help=help_text + " Comma-separated or repeated.",
    )


def split_scopes(values: tuple[str, ...]) -> list[str]:
    return [s for v in values for s in v.replace(",", " ").split() if s]


def note(text: str) -> None:
    click.echo(f"[lmsp] {clean(text)}", err=True)


def print_stream(events: Iterable[dict[str, Any]], as_json: bool) -> dict[str, Any] | None:
    """Write the text deltas as they come (or every event as a JSON line); return the
    terminal event. Restarts the server went through are noted on stderr."""
    terminal: dict[str, Any] | None = None
    wrote = False
    for event in events:
        kind = event.get("type", "")
        if as_json:
            click.echo(clean_json(event, indent=None))
        elif kind == "response.output_text.delta":
            click.echo(clean(event.get("delta", ""), multiline=True), nl=False)
            wrote = True
        elif kind == "response.queued" and event.get("reset"):
            if wrote:
                click.echo()
            note("the server restarted: the task starts again from the beginning")
            wrote = False
        elif kind == "response.in_progress" and event.get("resumed"):
            note("the server restarted: the task resumes where it stopped")
        if kind in {
            "response.completed",
            "response.incomplete",
            "response.failed",
            "response.cancelled",
        }:
            terminal = event
    if wrote:
        click.echo()
    return terminal


def finish(terminal: dict[str, Any] | None) -> None:
    """Exit non-zero for a failed or cancelled response, with one line saying why."""
    if terminal is None:
        raise click.ClickException("the stream ended before the response finished")
    kind = terminal["type"]
    if kind == "response.failed":
        error = (terminal.get("response") or {}).get("error") or {}
        code = error.get("code", "failed")
        raise click.ClickException(
            f"the response failed: {clean(error.get('message', ''))} ({clean(code)})"
        )
    if kind == "response.cancelled":
        raise click.ClickException("the response was cancelled")
    if kind == "response.incomplete":
        note("stopped at max_output_tokens")
