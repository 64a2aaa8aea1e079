"""The figures ``/metrics`` reads when it is scraped (Prometheus collectors): what lives
in the database (tasks by status, the queue, each client's usage) and in the engine
processes (their pids, a crash loop's failure, the embedding requests they dropped)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from lmsp.engines.host import ModelHost
from lmsp.metrics import Metrics, per_model
from lmsp.protocol.states import Status
from lmsp.store import tasks as task_store
from lmsp.store import usage as usage_store
from lmsp.store.db import Database


def collect(metrics: Metrics, db: Database, host: ModelHost) -> None:
    """Add every collector of this module to ``metrics``."""
    metrics.add_collector(lambda: database_figures(db))
    metrics.add_collector(lambda: engine_figures(host))
    metrics.add_collector(lambda: usage_figures(db))
    metrics.add_collector(lambda: embedding_figures(host))


def engine_figures(host: ModelHost) -> list[Metric]:
    """Each model's engine process: its pid while it runs, and whether its crash loop
    marked the model failed."""
    statuses = host.engine_status()
    return [
        per_model(
            "lmsp_engine_pid",
            "The process id of a model's engine.",
            ((status["model"], status["pid"]) for status in statuses if status["pid"] is not None),
        ),
        per_model(
            "lmsp_engine_failed",
            "1 when a model's engine crashed too often and is not started again.",
            ((status["model"], int(status["state"] == "failed")) for status in statuses),
        ),
    ]


def database_figures(db: Database) -> list[Metric]:
    """The figures that live in the database, read when ``/metrics`` is scraped."""
    conn = db.reader()
    by_status = GaugeMetricFamily(
        "lmsp_tasks", "Tasks stored, by status (finished ones until retention).", labels=["status"]
    )
    counts = task_store.status_counts(conn)
    for status in Status:
        by_status.add_metric([status.value], counts.get(status.value, 0))
    queue = GaugeMetricFamily("lmsp_queue_depth", "Tasks queued, waiting for a runner slot.")
    queue.add_metric([], counts.get(Status.QUEUED.value, 0))
    return [by_status, queue]


def usage_figures(db: Database) -> list[Metric]:
    """Each client's requests and tokens, from the usage ledger (durable: a restart
    does not reset these counters)."""
    names = {
        "requests": "Finished requests of a client (its embeddings requests included).",
        "input_tokens": "Prompt tokens of a client's finished requests (and embedded tokens).",
        "cached_tokens": "Prompt tokens read from a cached prefix.",
        "output_tokens": "Generated tokens of a client's finished requests.",
    }
    families = {
        key: CounterMetricFamily(f"lmsp_client_{key}", text, labels=["client_id", "client"])
        for key, text in names.items()
    }
    for row in usage_store.totals_by_client(db.reader()):
        for key, family in families.items():
            family.add_metric([row["client_id"], row["name"] or ""], int(row[key] or 0))
    return list(families.values())


def embedding_figures(host: ModelHost) -> list[Metric]:
    """Embedding requests each loaded model's engine dropped on a cancel (since that
    engine started)."""
    family = CounterMetricFamily(
        "lmsp_embedding_cancelled",
        "Embedding requests an engine dropped because their client went away.",
        labels=["model"],
    )
    for model, count in host.embeds_cancelled().items():
        family.add_metric([model], count)
    return [family]
