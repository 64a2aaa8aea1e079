"""``lmsp models ls | add PATH --id NAME | add --id NAME --remote URL … | show NAME | rm NAME |
verify [NAME] | set NAME --temperature …``.

Every command talks to the running service over HTTP. ``add`` names a file on the
service's machine: the service copies it into its blob store while hashing it. The
command first hashes the file itself with a progress bar and sends that digest along,
so the import fails (``digest_mismatch``) rather than registering a file that changed
while it was read; the service's copy then shows as a second, indeterminate bar.
``verify`` asks the service to recompute each model's full SHA-256 and prints the
outcome; it exits with status 1 if any model is corrupt. ``add --remote`` adds a model an
upstream serves (docs/remote-engines.md), ``show`` prints one model and a remote one's
upstream and capabilities.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)

from lmsp.cli.errors import CliError
from lmsp.cli.remote import ask, connect, print_json, remote_options, size, table
from lmsp.cli.safe import clean
from lmsp.client import APIError, Client
from lmsp.gguf import NotGGUF, check_structure
from lmsp.outbound.hub import is_reference
from lmsp.store.blobs import hash_file

F = TypeVar("F", bound=Callable[..., Any])

#: the progress bars go to stderr, so stdout stays the result alone
progress_console = Console(stderr=True)
#: copying a model into the blob store takes as long as the file is big
NO_TIMEOUT = httpx.Timeout(None, connect=5.0)


@click.group("models", invoke_without_command=True)
@remote_options
@click.pass_context
def models(ctx: click.Context, url: str | None, token: str | None, as_json: bool) -> None:
    """Models of the running service: list, import, delete, verify.

    `lmsp models` alone lists them, as `lmsp models ls` and `lmsp list` do."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(list_models, url=url, token=token, as_json=as_json)
    elif url or token or as_json:  # refused, never ignored
        raise click.UsageError(
            f"options go after the command: lmsp models {ctx.invoked_subcommand} --json"
        )


def _context(model: dict[str, Any]) -> str:
    """The context the service runs the model at, and the trained one when it differs
    (past it, positions are stretched with YaRN: docs/models.md)."""
    served = model.get("context_length")
    trained = (model.get("metadata") or {}).get("context_length")
    if not isinstance(served, int):
        return f"{trained:,} (trained)" if isinstance(trained, int) else ""
    if isinstance(trained, int) and trained != served:
        return f"{served:,} (trained {trained:,})"
    return f"{served:,}"


@models.command("ls", short_help="List models: size, quantization, context, capabilities.")
@remote_options
def list_models(url: str | None, token: str | None, as_json: bool) -> None:
    """List models: size, quantization, the context the service runs each at (and the
    trained one when it differs), capabilities, status, whether loaded, and digest."""
    data = ask(url, token, as_json, Client.models)
    if data is None:
        return
    rows = []
    for m in data:
        meta = m.get("metadata") or {}
        kind = " ".join(str(meta[k]) for k in ("architecture",) if meta.get(k))
        rows.append(
            (
                m["id"],
                size(m["size_bytes"]),
                f"{m['format']} {kind}".strip(),
                str(meta.get("quantization") or ""),
                _context(m),
                ", ".join(m.get("capabilities") or []),
                m.get("status", "ready"),
                "yes" if m["loaded"] else "",
                m["digest"].split(":", 1)[-1][:12],
            )
        )
    columns = ["ID", "SIZE", "FORMAT", "QUANT", "CONTEXT", "CAPABILITIES", "STATUS", "LOADED"]
    table(None, [*columns, "DIGEST"], rows)


def _bar() -> Progress:
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeElapsedColumn(),
        console=progress_console,
        transient=False,
    )


@models.command("add", short_help="Import a local GGUF file, or add a remote model.")
@click.argument(
    "path", required=False, type=click.Path(exists=True, dir_okay=False, path_type=Path)
)
@click.option("--id", "model_id", required=True, help="The id to serve the model under.")
@click.option("--remote", "upstream", help="A remote model: its upstream's base URL.")
@click.option(
    "--replica", "replicas", multiple=True, help="Another upstream of the same model (repeat)."
)
@click.option("--upstream-model", help="The model id the upstream serves it under.")
@click.option(
    "--tokenizer",
    help="A remote model's tokenizer: a GGUF file of the same model, its tokenizer.json, "
    "or a hub reference hf.co/OWNER/REPO[:QUANT] (its tokenizer.json, or a GGUF's "
    "vocabulary, fetched).",
)
@click.option("--api-key-env", help="The environment variable holding the upstream's key.")
@click.option("--inflight", type=int, default=4, show_default=True, help="Streams at once.")
@remote_options
def add_model(
    path: Path | None,
    model_id: str,
    upstream: str | None,
    replicas: tuple[str, ...],
    upstream_model: str | None,
    tokenizer: str | None,
    api_key_env: str | None,
    inflight: int,
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Import a local GGUF file (copied into the service's blob store while hashed), or
    with --remote add a model an upstream serves (llama-server, vLLM, SGLang:
    docs/remote-engines.md), checked against it before anything is written."""
    if upstream is not None or upstream_model or tokenizer is not None or replicas:
        if path is not None:
            raise click.UsageError("a remote model takes --tokenizer, not a PATH")
        if upstream is None or upstream_model is None or tokenizer is None:
            raise click.UsageError("--remote, --upstream-model and --tokenizer go together")
        remote = {
            "url": upstream,
            "replicas": list(replicas),
            "upstream_model": upstream_model,
            "api_key_env": api_key_env,
            "inflight": inflight,
        }
        _add_remote(model_id, _tokenizer_file(tokenizer), remote, url, token, as_json)
        return
    if path is None:
        raise click.UsageError("give the PATH of a GGUF file, or --remote URL")
    source = path.resolve()
    file_size = source.stat().st_size
    # what the service would refuse is refused before a byte is hashed or copied
    try:
        with source.open("rb") as fh:
            check_structure(fh, file_size)
    except NotGGUF as exc:
        raise CliError(f"Not a whole GGUF model file: {exc}", "invalid_model_file") from None
    with connect(url, token) as api:
        try:
            api.request("GET", f"/v1/models/{model_id}")
        except APIError as exc:
            if exc.status in (400, 401):  # a bad id or token: said before hashing
                raise
        else:
            raise CliError(f"A model {model_id!r} exists.", "model_exists")
        with _bar() as progress:
            hashing = progress.add_task("hashing", total=file_size)
            digest, _ = hash_file(source, lambda n: progress.advance(hashing, n))
            copying = progress.add_task("copying into the blob store", total=None)
            body = {"id": model_id, "path": str(source), "digest": digest}
            try:
                model = api.request("POST", "/v1/models", json=body, timeout=NO_TIMEOUT)
            finally:
                progress.update(copying, total=file_size, completed=file_size)
    if as_json:
        print_json(model)
        return
    click.echo(f"added {model['id']}: {model['digest']} ({size(model['size_bytes'])})")


def _tokenizer_file(given: str) -> str:
    """``--tokenizer``: a local file (a GGUF or a tokenizer.json), sent as its absolute
    path, or a hub reference (``hf.co/{owner}/{repo}[:{quant}]``) the service fetches."""
    if is_reference(given):
        return given.strip()
    if given.startswith(("http://", "https://")):
        raise click.BadParameter(
            "give a local file (a GGUF or a tokenizer.json) or an hf.co/{owner}/{repo} "
            "reference: no other address is fetched",
            param_hint="--tokenizer",
        )
    path = Path(given).expanduser()
    if not path.is_file():
        raise click.BadParameter(f"{given!r} is not a file", param_hint="--tokenizer")
    return str(path.resolve())


def _add_remote(
    model_id: str,
    tokenizer: str,
    remote: dict[str, Any],
    url: str | None,
    token: str | None,
    as_json: bool,
) -> None:
    """Add a remote model: the service checks the tokenizer against the upstream and
    probes what it can do before it writes anything."""
    body = {"id": model_id, "path": tokenizer, "remote": remote}
    added = ask(
        url,
        token,
        as_json,
        lambda api: api.request("POST", "/v1/models", json=body, timeout=NO_TIMEOUT),
    )
    if added is not None:
        caps = (added.get("remote") or {}).get("capabilities") or {}
        click.echo(clean(f"added {added['id']}: {remote['url']} ({_caps(caps)})"))


def _caps(caps: dict[str, Any]) -> str:
    flags = (
        "token_ids",
        "streamed_ids",
        "grammar",
        "gbnf",
        "logprobs",
        "embeddings",
        "deterministic",
    )
    shown = [f"{name}={'yes' if caps.get(name) else 'no'}" for name in flags]
    return ", ".join([f"{caps.get('dialect', '?')}", f"context {caps.get('n_ctx', '?')}", *shown])


@models.command("show", short_help="One model: its record, and a remote one's upstream.")
@click.argument("model_id")
@remote_options
def show_model(model_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """One model: size, format, context, status, digest; for a remote model its upstream
    and what the upstream was found able to do when the model was added."""
    model = ask(url, token, as_json, lambda api: api.request("GET", f"/v1/models/{model_id}"))
    if model is None:
        return
    rows = [
        ("id", model["id"]),
        ("format", model["format"]),
        ("size", size(model["size_bytes"])),
        ("context", _context(model)),
        ("status", model.get("status", "ready")),
        ("loaded", "yes" if model["loaded"] else "no"),
        ("digest", model["digest"]),
    ]
    remote = model.get("remote")
    if remote:
        rows += [
            ("upstream", remote["url"]),
            ("replicas", ", ".join(remote.get("replicas") or []) or "-"),
            ("upstream model", remote["upstream_model"]),
            ("api key from", remote.get("api_key_env") or "-"),
            ("inflight", str(remote.get("inflight"))),
        ]
        caps = remote.get("capabilities") or {}
        rows += [(f"capability {name}", str(value)) for name, value in sorted(caps.items())]
    table(None, ["FIELD", "VALUE"], [(k, clean(str(v))) for k, v in rows])


@models.command("rm", short_help="Delete a model (refused while tasks use it).")
@click.argument("model_id")
@remote_options
def remove_model(model_id: str, url: str | None, token: str | None, as_json: bool) -> None:
    """Delete a model (refused while unfinished tasks use it); its blob goes too unless
    another model names the same file."""
    gone = ask(url, token, as_json, lambda api: api.request("DELETE", f"/v1/models/{model_id}"))
    if gone is not None:
        click.echo(f"deleted {clean(model_id)}")


@models.command("verify", short_help="Recompute models' SHA-256 and record the outcome.")
@click.argument("model_id", required=False)
@remote_options
def verify_models(model_id: str | None, url: str | None, token: str | None, as_json: bool) -> None:
    """Recompute the full SHA-256 of one model (or all) and record the outcome."""
    results: list[dict[str, Any]] = []
    with connect(url, token) as api:
        if model_id is None:
            ids = [m["id"] for m in api.models()]
        else:
            ids = [api.request("GET", f"/v1/models/{model_id}")["id"]]
        for ident in ids:
            with progress_console.status(f"verifying {clean(ident)}"):
                results.append(
                    api.request("POST", f"/v1/models/{ident}/verify", timeout=NO_TIMEOUT)
                )
    if as_json:
        print_json(results)
    else:
        for r in results:
            verdict = "ok" if r["status"] == "ready" else f"CORRUPT: {r.get('problem')}"
            click.echo(clean(f"{r['id']}: {verdict}"))
    corrupt = [r["id"] for r in results if r["status"] != "ready"]
    if corrupt:
        raise CliError(f"corrupt: {', '.join(corrupt)}", "model_corrupt")


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


@models.command("set", short_help="Set a model's sampling defaults.")
@click.argument("model_id")
@_default_options
@remote_options
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
    path, body = f"/v1/models/{model_id}", {"defaults": changes}
    model = ask(url, token, as_json, lambda api: api.request("PATCH", path, json=body))
    if model is None:
        return
    shown = ", ".join(f"{k}={v}" for k, v in sorted(model["defaults"].items())) or "none"
    click.echo(clean(f"{model['id']}: defaults {shown}"))
