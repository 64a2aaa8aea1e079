"""The ``lmsp`` command. ``serve`` and ``gc`` work on the data directory directly; the
other commands talk to a running server over HTTP."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from lmsp import __version__, config


def _settings(data_dir: Path | None, **overrides: object) -> config.Settings:
    try:
        settings = config.from_env()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from exc
    return settings.with_overrides(data_dir=data_dir, **overrides)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="lmsp")
def main() -> None:
    """lmsp — a local model service for AI agents whose work is durable."""


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), help="Data directory (LMSP_DATA_DIR).")
@click.option("--host", help="Address to bind (LMSP_HOST, default 127.0.0.1).")
@click.option("--port", type=int, help="Port (LMSP_PORT, default 8430).")
def serve(data_dir: Path | None, host: str | None, port: int | None) -> None:
    """Run the service in the foreground."""
    import uvicorn

    from lmsp.api.app import create_app

    settings = _settings(data_dir, host=host, port=port)
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    click.echo(f"lmsp {__version__}: data in {settings.data_dir}", err=True)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level="info",
        timeout_graceful_shutdown=5,
    )


@main.command()
@click.option("--data-dir", type=click.Path(path_type=Path), help="Data directory (LMSP_DATA_DIR).")
@click.option("--retention", help="Keep finished work this long (e.g. 30s, 12h, 7d).")
def gc(data_dir: Path | None, retention: str | None) -> None:
    """Delete finished tasks, events and responses past the retention period."""
    from lmsp.store.db import Database
    from lmsp.tasks.retention import sweep

    keep = None
    if retention is not None:
        try:
            keep = config.parse_duration(retention)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--retention") from exc
    settings = _settings(data_dir, retention=keep)
    if not settings.db_path.exists():
        raise click.ClickException(f"no lmsp database in {settings.data_dir}")
    db = Database(settings.db_path)
    try:
        swept = sweep(db, settings.retention)
    finally:
        db.close()
    click.echo(
        f"deleted {swept.responses} finished responses and {swept.idempotency_keys} expired keys"
    )


from .clients import clients  # noqa: E402
from .doctor import doctor  # noqa: E402
from .pair import pair  # noqa: E402
from .run import run  # noqa: E402
from .tasks import tasks  # noqa: E402

main.add_command(run)
main.add_command(tasks)
main.add_command(pair)
main.add_command(clients)
main.add_command(doctor)

from .models import models  # noqa: E402

main.add_command(models)

if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
