"""The ``lmsp`` command. ``serve`` and ``gc`` work on the data directory directly; the
other commands talk to a running server over HTTP."""

from __future__ import annotations

import contextlib
import logging
import math
import os
import resource
import shutil
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import click

from lmsp import __version__, config, datadir
from lmsp.cli import database
from lmsp.cli.common import DATA_DIR_HELP, TOKEN_HELP, URL_HELP
from lmsp.cli.errors import CliError, Lazy

if TYPE_CHECKING:
    from lmsp.cluster.startup import Prepared


def _settings(data_dir: Path | None, **overrides: object) -> config.Settings:
    try:
        settings = config.from_env()
    except ValueError as exc:
        raise CliError(str(exc), "invalid_setting") from exc
    return settings.with_overrides(data_dir=data_dir, **overrides)


@click.group(cls=Lazy, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lmsp")
@click.option("--url", help=URL_HELP)
@click.option("--token", help=TOKEN_HELP)
@click.pass_context
def main(ctx: click.Context, url: str | None, token: str | None) -> None:
    """lmsp — a local model service for AI agents whose work is durable.

    `--url` and `--token` may come before the command (`lmsp --url … tasks ls`) or
    after it; without them the local service and its owner token are used.
    """
    ctx.obj = {"url": url, "token": token}


def _lock(
    settings: config.Settings, command: str, waiting: Callable[[str], None] | None = None
) -> datadir.DataDirLock:
    """The data directory's lock, or one line naming its holder and exit status 1
    (``waiting``: told who holds it, then the lock awaited)."""
    os.umask(0o077)  # whatever this process creates in the data directory is private
    try:
        return datadir.acquire(settings.data_dir, command, waiting)
    except datadir.DataDirBusy as exc:
        raise CliError(str(exc), "data_dir_in_use") from None
    except OSError as exc:
        problem = f"cannot use {settings.data_dir}: {exc.strerror}"
        raise CliError(problem, "data_dir_error") from None


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening address now (listening starts once recovery is done), so a
    port in use is found before anything in the data directory changes."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}", "listen_failed") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise CliError(f"cannot listen on {host}:{port}: {exc.strerror}", "listen_failed") from None
    sock.set_inheritable(True)
    return sock


def _reach(host: str, port: int) -> str:
    """The URL a client on this machine reaches a server bound to ``host:port`` at
    (an unspecified address is reached on loopback)."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _descriptor_budget(wanted: int) -> int:
    """Raise the open-file limit to its hard maximum and keep the connection limit
    under it, with room for the database, the models and the logs."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = max(16, int(soft) - 128)
    if wanted > room:
        logging.getLogger("lmsp").warning(
            "LMSP_MAX_CONNECTIONS=%d is over what %d open files allow: using %d",
            wanted,
            soft,
            room,
        )
        return room
    return wanted


def _command_hint() -> str | None:
    """Where the ``lmsp`` command is, when a shell would not find it (``make serve``
    installs it in a virtual environment that is not on PATH)."""
    here = Path(sys.executable).parent / "lmsp"
    found = shutil.which("lmsp")
    if not here.exists() or (found is not None and Path(found).resolve() == here.resolve()):
        return None
    activate = here.parent / "activate"
    if not activate.exists():
        return f"the lmsp command is {here} (not on PATH)"
    return f"the lmsp command is {here}; `. {activate}` in another shell puts it on PATH"


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), help=DATA_DIR_HELP)
@click.option("--host", help=config.declared("host").option_help("Address to bind"))
@click.option("--port", type=int, help=config.declared("port").option_help("Port"))
@click.option(
    "--standby",
    is_flag=True,
    help="Wait, loaded, for the lmsp serve holding the data directory to exit, then take"
    " over at once (its engines too, where LMSP_ENGINE_ORPHAN_TIMEOUT lets them outlive it).",
)
def serve(data_dir: Path | None, host: str | None, port: int | None, standby: bool) -> None:
    """Run the service in the foreground.

    In this order: lock the data directory (refused if another lmsp process holds it;
    awaited with --standby), bind the address (refused if it is in use) and note it in
    the directory's lock file (where the lmsp command finds it), then open the
    directory, run startup recovery, launch the engines the unfinished tasks need,
    start the HTTP application and start listening.
    """
    from lmsp import logs

    settings = _settings(data_dir, host=host, port=port)
    if settings.database_url:  # one line, not a traceback, for a URL that cannot work
        database.reach(settings.database_url)
    prepared: Prepared | None = None
    if standby:
        lock, prepared = _standby(settings)
    else:
        lock = _lock(settings, "lmsp serve")
    sock = _listen(settings.host, settings.port)
    lock.record_address(_reach(settings.host, sock.getsockname()[1]))
    logs.configure(settings.log_format)
    # the directory opened and recovered, and unfinished tasks' engines loading, before
    # the HTTP application's imports (most of a second), which their loading overlaps
    from lmsp.cluster.startup import head_start

    head = head_start(settings, lock, prepared)
    try:
        import uvicorn

        from lmsp.api.app import create_app
        from lmsp.api.eventstream import Serving
        from lmsp.api.guard import guarded_protocol
    except BaseException:
        head.close()
        raise
    _announce(settings)
    protocol = guarded_protocol(
        settings.header_timeout,
        settings.body_timeout,
        _descriptor_budget(settings.max_connections),
        settings.max_header_bytes,
        settings.http,
    )
    server = Serving(  # uvicorn's, its open event streams ended first when it stops
        uvicorn.Config(
            create_app(settings, lock, head),
            host=settings.host,
            port=settings.port,
            http=protocol,
            # WebSockets (lmsp.api.websocket): a frame is a create body, capped as one;
            # no compression state held per idle socket
            ws="websockets-sansio",
            ws_max_size=settings.max_body_bytes,
            ws_per_message_deflate=False,
            # X-Forwarded-For and -Proto are believed only from a configured proxy:
            # uvicorn's default trusts them from loopback, where every local process is
            proxy_headers=bool(settings.trusted_proxies),
            forwarded_allow_ips=list(settings.trusted_proxies) or None,
            log_level="info",
            log_config=None,  # lmsp's handler formats uvicorn's lines too (text or json)
            # longer than clients keep an idle connection (httpx and the SDKs on it: 5 s),
            # so none sends a request on one as the server closes it (uvicorn's own 5 s
            # let a client's create meet the close: a connection error, not an answer);
            # idle connections are evicted first when the connection limit is reached
            timeout_keep_alive=math.ceil(settings.http_idle_timeout),
            timeout_graceful_shutdown=5,
        )
    )
    server.run(sockets=[sock])
    if not server.started:
        raise SystemExit(3)


def _announce(settings: config.Settings) -> None:
    """The start's lines in the log: where it serves, the owner's token, the command."""
    log = logging.getLogger("lmsp")
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    log.info(
        "lmsp %s on http://%s:%d, data in %s",
        __version__,
        host,
        settings.port,
        settings.data_dir,
        extra={"event": "service.start"},
    )
    log.info(
        "owner token (admin): %s — the lmsp command reads it from there; agents pair"
        " with `lmsp pair approve`",
        settings.owner_token_path,
        extra={"event": "service.owner_token"},
    )
    hint = _command_hint()
    if hint:
        log.info(hint, extra={"event": "service.command"})


#: what a standby imports while it waits: the service's start (uvicorn's protocols and
#: event loop, which its server imports as it starts: 15-20 ms), and what its first
#: requests and the recovered tasks' resumes would import on their way
STANDBY_IMPORTS = (
    "uvicorn",
    "uvicorn.protocols.http.httptools_impl",
    "uvicorn.protocols.websockets.websockets_sansio_impl",
    "uvicorn.lifespan.on",
    "uvicorn.loops.auto",
    "lmsp.api.app",
    "lmsp.api.guard",
    "lmsp.cluster.startup",
    "lmsp.engines.llama_cpp",
    "numpy",
    "httpx",
    "llguidance",
)


def _standby(settings: config.Settings) -> tuple[datadir.DataDirLock, Prepared]:
    """The data directory's lock, awaited with everything serving needs imported, the
    local models' blobs hashed and their tokenizers made (:func:`~lmsp.cluster.startup.
    prepare`):
    the kernel hands the lock over the moment its holder exits, however it exits."""
    import importlib

    from lmsp import logs

    logs.configure(settings.log_format)
    log = logging.getLogger("lmsp")
    for name in STANDBY_IMPORTS:
        importlib.import_module(name)
    with contextlib.suppress(ImportError):  # uvicorn's event loop where it is installed
        importlib.import_module("uvicorn.loops.uvloop")
    from lmsp.cluster.startup import prepare

    prepared = prepare(settings)

    def waiting(holder: str) -> None:
        log.info(
            "standby: %s holds %s; taking over when it exits",
            holder,
            settings.data_dir,
            extra={"event": "service.standby"},
        )

    lock = _lock(settings, "lmsp serve", waiting)
    log.info("standby: taking over %s", settings.data_dir, extra={"event": "service.takeover"})
    return lock, prepared


@main.command(short_help="Delete expired finished work and orphan blobs (server stopped).")
@click.option("--data-dir", type=click.Path(path_type=Path), help=DATA_DIR_HELP)
@click.option(
    "--retention",
    help=config.declared("retention").option_help("Keep finished work this long: 30s, 12h, 7d"),
)
def gc(data_dir: Path | None, retention: str | None) -> None:
    """Delete finished tasks, events and responses past the retention period, model
    blobs no record names, and saved prompt prefixes past their age or size. Refused
    while a server holds the data directory (it sweeps by itself every
    LMSP_GC_INTERVAL)."""
    from lmsp.engines.kvfiles import PrefixFiles
    from lmsp.runner.retention import sweep
    from lmsp.store.blobs import remove_orphans
    from lmsp.store.open import open_database

    keep = None
    if retention is not None:
        try:
            keep = config.parse_duration(retention)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--retention") from exc
    settings = _settings(data_dir, retention=keep)
    if not settings.database_url and not settings.db_path.exists():
        raise CliError(f"no lmsp database in {settings.data_dir}", "no_database")
    db = open_database(settings, _lock(settings, "lmsp gc"))
    try:
        kv = PrefixFiles(
            settings.kv_dir,
            max_bytes=settings.kv_cache_bytes,
            ttl=settings.kv_cache_ttl,
            reserve=settings.kv_cache_reserve,
        )
        swept = sweep(
            db, settings.retention, kv=kv, conversations=settings.conversation_retention or None
        )
        orphans = remove_orphans(db, settings.blobs_dir)
    finally:
        db.close()
    click.echo(
        f"deleted {swept.responses} finished responses and {swept.idempotency_keys} expired keys"
    )
    if swept.conversations:
        click.echo(f"deleted {swept.conversations} conversation(s) unused for the retention period")
    if orphans:
        click.echo(f"removed {len(orphans)} model blob(s) no record named")
    if swept.kv_bytes:
        click.echo(f"freed {swept.kv_bytes} bytes of saved prompt prefixes")


def _more_commands() -> None:
    """Add every command but ``serve`` and ``gc``: imported when one is named or the
    commands are listed, so that ``lmsp serve`` does not import what only the HTTP
    client commands use (the client, rich's live tables and progress bars, a browser)."""
    from lmsp.cli.aliases import logs  # also adds ``lmsp models alias``
    from lmsp.cli.clients import clients
    from lmsp.cli.console import console
    from lmsp.cli.doctor import doctor
    from lmsp.cli.fairshare import audit, limit, usage
    from lmsp.cli.models import list_models, models
    from lmsp.cli.pair import pair
    from lmsp.cli.ps import ps
    from lmsp.cli.pull import pull
    from lmsp.cli.run import run
    from lmsp.cli.tasks import tasks
    from lmsp.cli.webhooks import webhooks

    clients.add_command(limit)
    clients.add_command(usage)
    for command in (run, tasks, pair, clients, doctor, ps, console, models, audit, pull):
        main.add_command(command)
    main.add_command(list_models, "list")  # ollama's habit: `lmsp list` is `lmsp models ls`
    main.add_command(webhooks)
    main.add_command(logs)


main.more = _more_commands

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
