"""``lmsp doctor``: checks on the data directory itself (it works with the server up or
down): database integrity, schema version, model blobs against their records, blobs no
record names, who holds the directory, and file permissions (the database holds every
prompt and output: nobody but its user may read it). On a PostgreSQL database nodes
share (``LMSP_DATABASE_URL``): the connection, the clock skew between this machine and
the database (leases are judged by the database's clock), and every node's lease."""

from __future__ import annotations

import hashlib
import hmac
import sqlite3
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

import click
import httpx
from rich.text import Text

from lmsp import config, datadir
from lmsp.cli.common import DATA_DIR_HELP, JSON_HELP, target
from lmsp.cli.errors import CliError
from lmsp.cli.remote import console, print_json, table
from lmsp.store import audit, checks, pg_schema
from lmsp.store.blobs import orphans
from lmsp.store.clients import hash_token
from lmsp.store.db import Connection
from lmsp.store.migrations import MIGRATIONS
from lmsp.store.sql import SQLITE, Conn

CHUNK = 1 << 20
#: a clock skew past this many seconds is worth a warning
SKEW_WARN = 1.0


def db_errors() -> tuple[type[Exception], ...]:
    """What reading either database may raise (psycopg is imported when a check runs:
    every ``lmsp`` command, ``lmsp serve`` on SQLite among them, imports this module)."""
    import psycopg

    return (sqlite3.DatabaseError, OSError, psycopg.Error)


@dataclass
class Check:
    name: str
    status: str  # "ok", "warn" or "fail"
    detail: str


def _open_read_only(path: Path) -> Connection:
    conn = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=30, factory=Connection)
    conn.row_factory = sqlite3.Row
    return conn


def check_integrity(conn: Conn) -> Check:
    rows = checks.integrity(conn)
    if rows == ["ok"]:
        detail = "PRAGMA integrity_check: ok" if conn.dialect == SQLITE else "answers"
        return Check("database integrity", "ok", detail)
    return Check("database integrity", "fail", "; ".join(rows[:5]))


def check_schema(conn: Conn) -> Check:
    known = [name for name, _ in (MIGRATIONS if conn.dialect == SQLITE else pg_schema.MIGRATIONS)]
    try:
        applied = checks.applied_migrations(conn)
    except db_errors():
        return Check("schema version", "fail", "no _migrations table")
    unknown = sorted(set(applied) - set(known))
    if unknown:
        return Check("schema version", "fail", f"newer than this lmsp: {', '.join(unknown)}")
    missing = [n for n in known if n not in applied]
    if missing:
        return Check("schema version", "warn", f"{len(missing)} migration(s) apply on next start")
    return Check("schema version", "ok", f"{known[-1]} (current)")


def _sha256(path: Path) -> str:
    sha = hashlib.sha256()
    with path.open("rb") as src:
        while chunk := src.read(CHUNK):
            sha.update(chunk)
    return f"sha256:{sha.hexdigest()}"


def check_blobs(conn: Conn, blobs_dir: Path) -> list[Check]:
    found: list[Check] = []
    for row in checks.model_rows(conn):
        name = f"model {row['id']}"
        algo, _, hexdigest = str(row["digest"]).partition(":")
        path = blobs_dir / f"{algo}-{hexdigest}"
        if not path.is_file():
            found.append(Check(name, "fail", f"blob missing: {path.name}"))
        elif path.stat().st_size != row["size_bytes"]:
            size = path.stat().st_size
            found.append(Check(name, "fail", f"size {size} != recorded {row['size_bytes']}"))
        elif _sha256(path) != row["digest"]:
            found.append(Check(name, "fail", "blob digest differs from the record"))
        else:
            found.append(Check(name, "ok", f"{row['digest'][:19]}… {row['size_bytes']} bytes"))
    if not found:
        found.append(Check("models", "warn", "no model registered"))
    return found


def check_orphans(conn: Conn, blobs_dir: Path) -> Check:
    found = orphans(conn, blobs_dir)
    if not found:
        return Check("unreferenced blobs", "ok", "every blob has a model record")
    size = sum(p.stat().st_size for p in found if p.exists())
    return Check(
        "unreferenced blobs",
        "warn",
        f"{len(found)} blob(s), {size} bytes, that no model names (an import a crash"
        " interrupted); `lmsp gc` or the next start removes them",
    )


def check_permissions(settings: config.Settings) -> Check:
    """The directory ``0700``, the database files and the token ``0600``: nothing wider."""
    data_dir = settings.data_dir
    paths = [data_dir, settings.blobs_dir, settings.owner_token_path]
    paths += [data_dir / f"lmsp.db{suffix}" for suffix in ("", "-wal", "-shm")]
    wide = []
    for path in paths:
        mode = datadir.wider_than_private(path)
        if mode is not None:
            wide.append(f"{path.name or path} {mode:04o}")
    if not wide:
        return Check("permissions", "ok", "private to their user (0700 / 0600)")
    return Check(
        "permissions",
        "warn",
        f"readable by others: {', '.join(wide)} (chmod 700 the directories, 600 the files)",
    )


def check_owner_token(conn: Conn, path: Path) -> Check:
    name = "owner token file"
    if not path.is_file():
        return Check(name, "fail", f"{path} is missing")
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        return Check(name, "fail", f"mode {mode:04o}: readable by others (chmod 600 {path})")
    digest = hash_token(path.read_text().strip())
    row = checks.owner_row(conn)
    if row is None or not hmac.compare_digest(row["token_hash"], digest):
        return Check(name, "fail", "the token in the file is not the owner client's")
    if row["revoked_at"] is not None:
        return Check(name, "fail", "the owner client is revoked")
    return Check(name, "ok", f"mode {mode:04o}, matches the owner client")


def check_audit(conn: Conn) -> Check:
    """The audit log's hash chain: every row hashes the one before and itself."""
    try:
        checked, broken, why = audit.verify(conn)
    except db_errors():
        return Check("audit log", "warn", "no audit log yet (made on the next start)")
    if broken is not None:
        return Check("audit log", "fail", f"row {broken} breaks the hash chain: {why}")
    return Check("audit log", "ok", f"{checked} row(s), hash chain intact")


def check_server(url: str) -> Check:
    try:
        info = httpx.get(f"{url}/v1/service", timeout=2).json()
    except (httpx.HTTPError, ValueError):
        return Check("service", "warn", f"not running at {url}")
    return Check("service", "ok", f"{info.get('name')} {info.get('version')} at {url}")


def _skew_status(skew: float, limit: float) -> str:
    return "fail" if abs(skew) >= limit else "warn" if abs(skew) >= SKEW_WARN else "ok"


def check_clock(conn: Conn, limit: float) -> Check:
    """Leases, retention and idempotency keys are judged by the database's clock; a
    skew past ``limit`` (``LMSP_MAX_CLOCK_SKEW``) shows a machine whose time is wrong:
    a failure (what such a node stamps is off by as much)."""
    skew = checks.clock_skew(conn)
    text = f"the database's clock is {skew:+.3f}s from this machine's"
    if abs(skew) >= limit:
        text += f" (more than LMSP_MAX_CLOCK_SKEW, {limit:g}s: set this machine's clock)"
    return Check("clock skew", _skew_status(skew, limit), text)


def check_nodes(conn: Conn) -> Check:
    rows = checks.node_rows(conn)
    if not rows:
        return Check("nodes", "warn", "no node has joined yet")
    text = ", ".join(
        f"{r['id']} {r['status']}"
        + (f" (lease {float(r['lease_left']):.1f}s)" if r["status"] == "up" else "")
        for r in rows
    )
    lost = [r["id"] for r in rows if r["status"] == "up" and float(r["lease_left"]) < 0]
    return Check("nodes", "warn" if lost else "ok", text)


def check_node_clocks(conn: Conn, limit: float) -> Check:
    """Each live node's clock against the database's, as the node measured it at its
    last lease renewal."""
    rows = [r for r in checks.node_rows(conn) if r["status"] == "up"]
    measured = [r for r in rows if r["clock_skew"] is not None]
    if not measured:
        return Check("nodes' clocks", "ok", "no live node has measured its clock yet")
    text = (
        ", ".join(f"{r['id']} {float(r['clock_skew']):+.3f}s" for r in measured)
        + " (the database's clock minus each node's)"
    )
    worst = max((float(r["clock_skew"]) for r in measured), key=abs)
    return Check("nodes' clocks", _skew_status(worst, limit), text)


def diagnose_shared(settings: config.Settings, url: str) -> list[Check]:
    """A data directory whose state is in PostgreSQL."""
    from lmsp.store.pg import PgConnection, raw_connect

    try:
        conn = PgConnection(raw_connect(url))
    except db_errors() as exc:
        return [Check("database connection", "fail", f"cannot connect: {exc}")]
    try:
        found = [Check("database connection", "ok", f"PostgreSQL {checks.server_version(conn)}")]
        limit = settings.max_clock_skew
        found += [
            check_integrity(conn),
            check_schema(conn),
            check_clock(conn, limit),
            check_nodes(conn),
        ]
        found.append(check_node_clocks(conn, limit))
        found += check_blobs(conn, settings.blobs_dir)
        found.append(check_orphans(conn, settings.blobs_dir))
        found.append(check_owner_token(conn, settings.owner_token_path))
        found.append(check_permissions(settings))
        found.append(check_audit(conn))
    except db_errors() as exc:
        found = [Check("database", "fail", f"cannot read the database: {exc}")]
    finally:
        conn.close()
    return found


def diagnose(settings: config.Settings) -> list[Check]:
    if settings.database_url:
        shared = diagnose_shared(settings, settings.database_url)
        return [*shared, check_server(target(None, None, settings.data_dir).url)]
    if not settings.db_path.is_file():
        return [Check("database", "fail", f"no lmsp database in {settings.data_dir}")]
    conn = _open_read_only(settings.db_path)
    try:
        found = [check_integrity(conn), check_schema(conn)]
        found += check_blobs(conn, settings.blobs_dir)
        found.append(check_orphans(conn, settings.blobs_dir))
        found.append(check_owner_token(conn, settings.owner_token_path))
        found.append(check_permissions(settings))
        found.append(check_audit(conn))
    except sqlite3.DatabaseError as exc:
        found = [Check("database", "fail", f"cannot read {settings.db_path}: {exc}")]
    finally:
        conn.close()
    found.append(check_server(target(None, None, settings.data_dir).url))
    return found


@click.command("doctor", short_help="Check the data directory and the service.")
@click.option("--data-dir", type=click.Path(path_type=Path), help=DATA_DIR_HELP)
@click.option("--json", "as_json", is_flag=True, help=JSON_HELP)
def doctor(data_dir: Path | None, as_json: bool) -> None:
    """Check the data directory: database, schema, model blobs, owner token file."""
    try:
        settings = config.from_env().with_overrides(data_dir=data_dir)
    except ValueError as exc:
        raise CliError(str(exc), "invalid_setting") from None
    checks = diagnose(settings)
    failed = [c for c in checks if c.status == "fail"]
    if as_json:
        print_json({"ok": not failed, "checks": [asdict(c) for c in checks]})
    else:
        marks = {
            "ok": Text("ok", style="green"),
            "warn": Text("warn", style="yellow"),
            "fail": Text("FAIL", style="bold red"),
        }
        table(
            f"lmsp doctor: {settings.data_dir}",
            ["CHECK", "RESULT", "DETAIL"],
            [(c.name, marks[c.status], c.detail) for c in checks],
        )
        warned = [c for c in checks if c.status == "warn"]
        if warned and not failed:
            console().print(f"no check failed; {len(warned)} warning(s) above")
        elif not failed:  # one verdict: a failure is said once, below
            console().print("all checks passed")
    if failed:
        raise CliError(f"{len(failed)} check(s) failed", "checks_failed")
