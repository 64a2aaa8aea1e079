"""Shared fixtures: settings on a temporary data directory and an in-process client."""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from lmsp.api.app import create_app
from lmsp.app.root import open_service
from lmsp.app.service import Service
from lmsp.bootstrap import bundled_model_path, store_blob
from lmsp.config import Settings
from lmsp.store import clients
from tests import helpers
from tests.pgcluster import MISSING as PG_MISSING
from tests.pgcluster import REQUIRED as PG_REQUIRED
from tests.pgcluster import Cluster, bin_dir


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C and Ctrl-\\ mean what they do in a terminal, for every server and command
    the tests start: a shell without job control starts a background job (``make test
    &``) with SIGINT and SIGQUIT ignored, and children inherit that, so a test's Ctrl-C
    to ``lmsp ps --watch`` or Ctrl-\\ to ``lmsp serve`` would do nothing."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGQUIT) == signal.SIG_IGN:
        signal.signal(signal.SIGQUIT, signal.SIG_DFL)


@pytest.fixture(scope="session")
def blob_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled model copied into a blob store once per test session."""
    blobs = tmp_path_factory.mktemp("blob-cache")
    store_blob(blobs, bundled_model_path())
    return blobs


@pytest.fixture(scope="session", autouse=True)
def servers_link_the_model(blob_cache: Path) -> None:
    """Servers the tests start (``tests.helpers.Server``) link the cached model too."""
    helpers.BLOB_CACHE = blob_cache


@pytest.fixture
def settings(tmp_path: Path, blob_cache: Path) -> Settings:
    data_dir = tmp_path / "data"
    blobs = data_dir / "blobs"
    blobs.mkdir(parents=True)
    for blob in blob_cache.iterdir():  # a link, not a 92 MB copy, for every test
        os.link(blob, blobs / blob.name)
    # TestClient calls itself "testserver": a Host the service answers only when told;
    # the test engine runs on a thread (same protocol and loop, no process to spawn) in
    # in-process tests; `lmsp serve` (tests.helpers.Server) always runs engine processes
    return Settings(
        data_dir=data_dir,
        enable_test_engine=True,
        gc_interval=3600,
        allowed_hosts=("testserver",),
        in_thread_engines=frozenset({"test"}),
    )


@pytest.fixture
def client(settings: Settings) -> Iterator[TestClient]:
    """The real app with its lifespan (bootstrap, recovery, runner), in process."""
    with TestClient(create_app(settings)) as test_client:
        token = (settings.data_dir / "owner.token").read_text().strip()
        test_client.headers["Authorization"] = f"Bearer {token}"
        yield test_client


@pytest.fixture
def svc(settings: Settings) -> Iterator[Service]:
    """The service opened on a data directory, its runner not started: tests drive it
    with ``svc.runner.run_next()``."""
    service = open_service(settings)
    yield service
    service.runner.stop()
    service.host.close()
    service.db.close()


#: every token minted in this process and every log line written in it, for the
#: suite-wide leak scan in tests/test_zz_no_token_in_clear.py
MINTED_TOKENS: list[str] = []
LOG_LINES: list[str] = []


class _Collect(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        LOG_LINES.append(self.format(record))


@pytest.fixture(scope="session", autouse=True)
def token_watch() -> Iterator[None]:
    original = clients.new_token

    def recording() -> str:
        token = original()
        MINTED_TOKENS.append(token)
        return token

    clients.new_token = recording  # type: ignore[assignment]
    handler = _Collect(level=logging.DEBUG)
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s %(exc_text)s"))
    lmsp_logger = logging.getLogger("lmsp")
    previous = lmsp_logger.level
    lmsp_logger.setLevel(logging.DEBUG)
    logging.getLogger().addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger().removeHandler(handler)
        lmsp_logger.setLevel(previous)
        clients.new_token = original  # type: ignore[assignment]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """The campaigns' figures (kills, faults, cases, violations), after every run."""
    from tests.campaigns.invariants import FIGURES

    if FIGURES:
        terminalreporter.section("campaign figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[Cluster]:
    """A PostgreSQL server for the session (skips, or fails under
    ``LMSP_REQUIRE_POSTGRES=1``, without PostgreSQL)."""
    bins = bin_dir()
    if bins is None:
        if PG_REQUIRED:
            pytest.fail(PG_MISSING)
        pytest.skip(PG_MISSING)
    cluster = Cluster(bins)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def pg_url(pg_cluster: Cluster) -> str:
    """A blank database on the session's cluster."""
    return pg_cluster.database()
