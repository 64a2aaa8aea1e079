"""``lmsp models ls | add PATH --id NAME | rm NAME | verify [NAME] | set NAME --temperature …``.

Every command talks to the running service over HTTP. ``add`` names a file on the
service's machine: the service copies it into its blob store while hashing it. The
command first hashes the file itself with a progress bar and sends that digest along,
so the import fails (``digest_mismatch``) rather than registering a file that changed
while it was read; the service's copy then shows as a second, indeterminate bar.
``verify`` asks the service to recompute each model's full SHA-256 and prints the
outcome; it exits with status 1 if any model is corrupt.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from rich.table import Table

from lmsp.gguf import NotGGUF, check_structure
from lmsp.store.blobs import hash_file

from .common import START_HINT, Target, api_error_line, target
from .safe import clean, clean_json

F = TypeVar("F", bound=Callable[..., Any])
console = Console(stderr=True)


def _options(func: F) -> F:
    func = click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)
    func = click.option("--token", help="Bearer token (LMSP_TOKEN; default: the owner's).")(func)
    func = click.option("--url", help="Service URL (LMSP_URL; default: this machine's).")(func)
    return func


class _Api(httpx.Client):
    where: Target


@contextmanager
def _api(url: str | None, token: str | None) -> Iterator[_Api]:
    where = target(url, token)
    headers = {"Authorization": f"Bearer {where.token}"} if where.token else {}
    with _Api(base_url=where.url, headers=headers, timeout=None) as http:
        http.where = where
        try:
            yield http
        except httpx.ConnectError as exc:
            raise click.ClickException(f"cannot reach lmsp at {where.url} ({START_HINT})") from exc


def _answer(reply: httpx.Response, where: Target | None = None) -> Any:
    body: Any = reply.json() if reply.content else None
    if reply.is_error:
        error = body.get("error", {}) if isinstance(body, dict) else {}
        code = str(error.get("code", reply.status_code))
        message = str(error.get("message", reply.text))
        raise click.ClickException(api_error_line(reply.status_code, code, message, where))
    return body


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover


def _print_json(data: Any) -> None:
    click.echo(clean_json(data))


@click.group("models")
def models() -> None:
    """Models of the running service: list, import, delete, verify."""


@models.command("ls")
@_options
def list_models(url: str | None, token: str | None, as_json: bool) -> None:
    """List models with their digest, size, status and whether they are loaded."""
    with _api(url, token) as http:
        data = _answer(http.get("/v1/models"), http.where)["data"]
    if as_json:
        _print_json(data)
        return
    table = Table("id", "digest", "size", "format", "status", "loaded", box=None)
    for m in data:
        short = m["digest"].split(":", 1)[-1][:12]
        meta = m.get("metadata") or {}
        kind = " ".join(str(meta[k]) for k in ("architecture", "quantization") if meta.get(k))
        table.add_row(
            escape(clean(m["id"])),
            short,
            _size(m["size_bytes"]),
            escape(clean(f"{m['format']} {kind}".strip())),
            escape(clean(m.get("status", "ready"))),
            "yes" if m["loaded"] else "",
        )
    Console().print(table)


def _bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    )


@models.command("add")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--id", "model_id", required=True, help="The id to serve the model under.")
@_options
def add_model(path: Path, model_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Import a local GGUF file (copied into the service's blob store while hashed)."""
    source = path.resolve()
    size = source.stat().st_size
    # what the service would refuse is refused before a byte is hashed or copied
    try:
        with source.open("rb") as fh:
            check_structure(fh, size)
    except NotGGUF as exc:
        raise click.ClickException(
            f"Not a whole GGUF model file: {clean(exc)} (invalid_model_file)"
        ) from None
    with _api(url, token) as http:
        taken = http.get(f"/v1/models/{model_id}")
        if taken.status_code == 200:
            raise click.ClickException(f"A model {clean(model_id)!r} exists. (model_exists)")
        if taken.status_code in (401, 400):
            _answer(taken, http.where)
    with _api(url, token) as http, _bar() as progress:
        hashing = progress.add_task("hashing", total=size)
        digest, _ = hash_file(source, lambda n: progress.advance(hashing, n))
        copying = progress.add_task("copying into the blob store", total=None)
        body = {"id": model_id, "path": str(source), "digest": digest}
        try:
            model = _answer(http.post("/v1/models", json=body), http.where)
        finally:
            progress.update(copying, total=size, completed=size)
    if as_json:
        _print_json(model)
        return
    click.echo(f"added {model['id']}: {model['digest']} ({_size(model['size_bytes'])})")


@models.command("rm")
@click.argument("model_id")
@_options
def remove_model(model_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Delete a model (refused while unfinished tasks use it); its blob goes too unless
    another model names the same file."""
    with _api(url, token) as http:
        result = _answer(http.delete(f"/v1/models/{model_id}"), http.where)
    if as_json:
        _print_json(result)
        return
    click.echo(f"deleted {model_id}")


@models.command("verify")
@click.argument("model_id", required=False)
@_options
def verify_models(model_id: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """Recompute the full SHA-256 of one model (or all) and record the outcome."""
    results: list[dict[str, Any]] = []
    with _api(url, token) as http:
        if model_id is None:
            ids = [m["id"] for m in _answer(http.get("/v1/models"), http.where)["data"]]
        else:
            ids = [_answer(http.get(f"/v1/models/{model_id}"), http.where)["id"]]
        for ident in ids:
            with console.status(f"verifying {ident}"):
                results.append(_answer(http.post(f"/v1/models/{ident}/verify"), http.where))
    if as_json:
        _print_json(results)
    else:
        for r in results:
            verdict = "ok" if r["status"] == "ready" else f"CORRUPT: {r.get('problem')}"
            click.echo(clean(f"{r['id']}: {verdict}"))
    if any(r["status"] != "ready" for r in results):
        raise SystemExit(1)


#: ``lmsp models set`` options: the sampling defaults a model may carry
DEFAULT_OPTIONS: list[tuple[str, type[float] | type[int], str]] = [
    ("temperature", float, "0 … 2"),
    ("top_p", float, "0 … 1"),
    ("top_k", int, "0 (off) … 100000"),
    ("min_p", float, "0 (off) … 1"),
    ("presence_penalty", float, "-2 … 2"),
    ("frequency_penalty", float, "-2 … 2"),
    ("repeat_penalty", float, "1 (off); llama.cpp's repetition penalty"),
]


def _default_options(func: F) -> F:
    for name, kind, what in reversed(DEFAULT_OPTIONS):
        flag = "--" + name.replace("_", "-")
        func = click.option(flag, name, type=kind, help=f"Default {name} ({what}).")(func)
    func = click.option(
        "--unset",
        multiple=True,
        type=click.Choice([name for name, _, _ in DEFAULT_OPTIONS]),
        help="Remove a default (lmsp's own applies again); repeatable.",
    )(func)
    return func


@models.command("set")
@click.argument("model_id")
@_default_options
@_options
def set_defaults(
    model_id: str,
    unset: tuple[str, ...],
    url: str | None,
    token: str | None,
    as_json: bool,
    **values: float | int | None,
) -> None:
    """Set a model's sampling defaults: what requests that do not name a value run with
    (responses created from now on)."""
    changes: dict[str, float | int | None] = {k: v for k, v in values.items() if v is not None}
    changes.update({name: None for name in unset})
    if not changes:
        raise click.UsageError("name at least one default to set (or --unset)")
    with _api(url, token) as http:
        model = _answer(http.patch(f"/v1/models/{model_id}", json={"defaults": changes}))
    if as_json:
        _print_json(model)
        return
    shown = ", ".join(f"{k}={v}" for k, v in sorted(model["defaults"].items())) or "none"
    click.echo(clean(f"{model['id']}: defaults {shown}"))
