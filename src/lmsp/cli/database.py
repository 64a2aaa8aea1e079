"""A database URL that cannot be used is one line before anything starts."""

from __future__ import annotations

from lmsp.cli.errors import CliError

#: how long ``lmsp serve`` waits for the database to answer before it gives up
CONNECT_TIMEOUT = 10


def reach(url: str) -> None:
    """Connect to ``LMSP_DATABASE_URL`` once; a URL that does not parse or a server
    that does not answer (or refuses the login) is a :class:`CliError`, one line (the
    driver's first line, never the URL: it may hold a password), not a traceback."""
    import psycopg

    try:
        psycopg.connect(url, connect_timeout=CONNECT_TIMEOUT).close()
    except psycopg.Error as exc:
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
        first = first.replace(url, "the URL")  # a parse error quotes it, password and all
        raise CliError(f"cannot use LMSP_DATABASE_URL: {first}", "database_unreachable") from None
