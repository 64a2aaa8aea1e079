"""What the service counts, for ``GET /metrics`` (Prometheus) and ``lmsp ps``.

One :class:`Metrics` per service, with its own ``CollectorRegistry`` (never the process
default: tests build many apps in one process). The parts of the service report into it
through a few calls: the writer (:meth:`Metrics.transaction`), the runner
(:meth:`begin` / :meth:`prompt` / :meth:`token` / :meth:`end`), the model host
(:meth:`model_loaded` / :meth:`model_unloaded` / :meth:`engine_crashed` /
:meth:`engine_restarted`), the embeddings route (:meth:`embedded`), startup recovery
(:meth:`recovered`)
and the HTTP middleware (:meth:`http`). Figures that live in the database (tasks by
status, the queue) are read from it when scraped, through :meth:`add_collector`
(:func:`per_model` shapes a gauge of one figure a model).

The live view of the sequences being generated (:meth:`sequences`) is what ``lmsp ps``
shows: no prompt or output text is kept here, only counts and times.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
_COMMIT = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
_JOBS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
_TTFT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)
_RATE = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000)


@dataclass
class Sequence:
    """One task being generated: counts and times only."""

    task_id: str
    model: str
    started: float = field(default_factory=time.monotonic)
    started_at: float = field(default_factory=time.time)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    tokens: int = 0
    first_token: float | None = None
    # its prompt being read (until the first token of a generation): how far, as its
    # engine said, and at what speed (tokens evaluated a second)
    reading: bool = True
    prompt_read: int = 0
    prompt_total: int = 0
    prompt_rate: float | None = None

    def rate(self, now: float | None = None) -> float | None:
        """Tokens a second since the first token (``None`` before the second one)."""
        if self.first_token is None or self.tokens < 2:
            return None
        spent = (time.monotonic() if now is None else now) - self.first_token
        return (self.tokens - 1) / spent if spent > 0 else None


def holdups(sequences: list[Sequence]) -> dict[str, str]:
    """Why each sequence goes slower than alone, as far as the service can tell: a
    prompt being read by the same engine, whose steps its other sequences share (a
    long prompt is read in steps of up to a batch; each of them also carries one token
    of every sequence generating). Task id → the reason; none for a sequence alone."""
    found: dict[str, str] = {}
    for seq in sequences:
        readers = [o for o in sequences if o is not seq and o.model == seq.model and o.reading]
        if not readers:
            continue
        other = max(readers, key=lambda o: (o.prompt_total - o.prompt_read, o.prompt_tokens))
        size = other.prompt_total or other.prompt_tokens
        read = (
            f"{other.prompt_read:,} of {size:,} read" if other.prompt_total else f"{size:,} tokens"
        )
        what = f"the prompt of task {other.task_id} is being read ({read})"
        found[seq.task_id] = f"{'sharing' if seq.reading else 'slowed'}: {what}"
    return found


def per_model(name: str, text: str, values: Iterable[tuple[str, float]]) -> Metric:
    """A gauge read when ``/metrics`` is scraped: one figure a model (label ``model``)
    of ``values``, ``(model, figure)`` pairs."""
    family = GaugeMetricFamily(name, text, labels=["model"])
    for model, value in values:
        family.add_metric([model], value)
    return family


class _Callback(Collector):
    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self.produce = produce

    def collect(self) -> Iterable[Metric]:
        return self.produce()


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._writer_figures()
        self._generation_figures()
        self._service_figures()
        self._http_figures()
        self._live: dict[str, Sequence] = {}
        self._lock = threading.Lock()
        #: the generated-tokens counter of each model, its labels looked up once (a token's
        #: count is the hottest metric)
        self._generated: dict[str, Counter] = {}
        running = Gauge(
            "lmsp_running_sequences", "Sequences being generated now.", registry=self.registry
        )
        running.set_function(lambda: len(self._live))

    def _counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, labels, registry=self.registry)

    def _histogram(
        self, name: str, doc: str, buckets: tuple[float, ...], *labels: str
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self.registry)

    def _writer_figures(self) -> None:
        count, spread = self._counter, self._histogram
        self.write_transactions = count(
            "lmsp_write_transactions", "Write transactions committed by the writer."
        )
        self.write_failures = count(
            "lmsp_write_transaction_failures",
            "Write transactions rolled back (a full disk, an error).",
        )
        self.jobs_per_transaction = spread(
            "lmsp_write_jobs_per_transaction",
            "Jobs committed together in one transaction (group commit).",
            _JOBS,
        )
        self.commit_latency = spread(
            "lmsp_write_commit_seconds",
            "Time from BEGIN to the end of COMMIT of a write transaction.",
            _COMMIT,
        )
        self.events_written = count(
            "lmsp_events_written", "Task events committed to the event log."
        )
        self.write_cpu = count(
            "lmsp_write_cpu_seconds",
            "CPU time the writer thread spent in the transactions it committed; the"
            " rest of lmsp_write_commit_seconds it waited (for the disk, or for the"
            " interpreter's lock held by the process's other threads).",
        )

    def _generation_figures(self) -> None:
        count, spread = self._counter, self._histogram
        self.prompt_tokens = count("lmsp_prompt_tokens", "Prompt tokens of the tasks run.", "model")
        self.cached_tokens = count(
            "lmsp_cached_prompt_tokens",
            "Prompt tokens taken from a cache instead of evaluated.",
            "model",
        )
        self.generated_tokens = count("lmsp_generated_tokens", "Tokens generated.", "model")
        self.ttft = spread(
            "lmsp_time_to_first_token_seconds",
            "From the start of a task's generation (model ready) to its first token.",
            _TTFT,
            "model",
        )
        self.token_rate = spread(
            "lmsp_tokens_per_second",
            "Generation speed of each finished sequence (after its first token).",
            _RATE,
            "model",
        )
        self.early_starts = count(
            "lmsp_early_starts",
            "Creates' first turns begun while their commit was written: adopted by their "
            "task, or dropped (another task claimed, inputs not the same).",
            "outcome",
        )

    def _service_figures(self) -> None:
        """Startup recovery, models, their engines and embeddings."""
        count = self._counter
        self.recoveries = count(
            "lmsp_recovered_tasks",
            "Tasks found unfinished at startup, by on_restart policy and outcome.",
            "policy",
            "outcome",
        )
        self.model_loads = count("lmsp_model_loads", "Models loaded (one context each).", "model")
        self.model_unloads = count("lmsp_model_unloads", "Models unloaded.", "model")
        self.engine_crashes = count(
            "lmsp_engine_crashes",
            "Engine processes that ended unasked (a segfault, kill -9, out of memory).",
            "model",
        )
        self.engine_restarts = count(
            "lmsp_engine_restarts", "Engine processes started again after a crash.", "model"
        )
        self.embedded_inputs = count(
            "lmsp_embedding_inputs", "Inputs embedded (POST /v1/embeddings).", "model"
        )
        self.embedded_tokens = count(
            "lmsp_embedding_tokens", "Tokens of the inputs embedded.", "model"
        )
        self.embedding_yields = count(
            "lmsp_embedding_yields",
            "Turns an embedding request gave way to generating sequences (LMSP_EMBED_SHARE).",
            "model",
        )
        self.embeddings_abandoned = count(
            "lmsp_embedding_abandoned",
            "Embedding requests whose client went away before the answer (cancelled).",
            "model",
        )

    def _http_figures(self) -> None:
        self.http_requests = self._counter(
            "lmsp_http_requests",
            "HTTP requests answered, by route template, method and status.",
            "method",
            "route",
            "status",
        )
        self.http_latency = self._histogram(
            "lmsp_http_request_seconds",
            "Time to answer an HTTP request (for a stream: until it ends).",
            _LATENCY,
            "method",
            "route",
        )

    # -- the writer ---------------------------------------------------------------------
    def transaction(self, jobs: int, seconds: float, events: int, cpu: float = 0.0) -> None:
        self.write_transactions.inc()
        self.jobs_per_transaction.observe(jobs)
        self.commit_latency.observe(seconds)
        self.write_cpu.inc(cpu)
        if events:
            self.events_written.inc(events)

    def transaction_failed(self) -> None:
        self.write_failures.inc()

    # -- the runner ---------------------------------------------------------------------
    def begin(self, task_id: str, model: str) -> None:
        """A task's generation starts (its model is loaded)."""
        with self._lock:
            self._live[task_id] = Sequence(task_id, model)

    def reading(self, task_id: str, tokens: int) -> None:
        """A task's prompt of ``tokens`` goes to its engine (shown while it is read;
        counted by :meth:`prompt` once read)."""
        seq = self._live.get(task_id)
        if seq is not None:
            seq.prompt_tokens = tokens
            seq.reading, seq.prompt_read, seq.prompt_total, seq.prompt_rate = True, 0, 0, None

    def read(self, task_id: str, read: int, total: int, rate: float | None) -> None:
        """Its engine says how far a task's prompt is read (a long one's, now and then)."""
        seq = self._live.get(task_id)
        if seq is not None and seq.reading:
            seq.prompt_read, seq.prompt_total, seq.prompt_rate = read, total, rate

    def prompt(self, task_id: str, tokens: int, cached: int = 0) -> None:
        seq = self._live.get(task_id)
        if seq is None:
            return
        seq.prompt_tokens, seq.cached_tokens = tokens, cached
        self.prompt_tokens.labels(seq.model).inc(tokens)
        if cached:
            self.cached_tokens.labels(seq.model).inc(cached)

    def token(self, task_id: str, count: int = 1) -> None:
        seq = self._live.get(task_id)
        if seq is None:
            return
        if seq.first_token is None:
            seq.first_token = time.monotonic()
            self.ttft.labels(seq.model).observe(seq.first_token - seq.started)
        if seq.reading:  # its prompt is read
            seq.reading = False
            seq.prompt_read = seq.prompt_total
        seq.tokens += count
        counter = self._generated.get(seq.model)
        if counter is None:
            counter = self._generated[seq.model] = self.generated_tokens.labels(seq.model)
        counter.inc(count)

    def end(self, task_id: str) -> None:
        with self._lock:
            seq = self._live.pop(task_id, None)
        if seq is not None:
            rate = seq.rate()
            if rate is not None:
                self.token_rate.labels(seq.model).observe(rate)

    def sequences(self) -> list[Sequence]:
        with self._lock:
            return sorted(self._live.values(), key=lambda s: s.started)

    # -- models, recovery, HTTP -----------------------------------------------------------
    def model_loaded(self, model: str) -> None:
        self.model_loads.labels(model).inc()

    def model_unloaded(self, model: str) -> None:
        self.model_unloads.labels(model).inc()

    def early_start(self, outcome: str) -> None:
        self.early_starts.labels(outcome).inc()

    def engine_crashed(self, model: str) -> None:
        self.engine_crashes.labels(model).inc()

    def engine_restarted(self, model: str) -> None:
        self.engine_restarts.labels(model).inc()

    def embedded(self, model: str, inputs: int, tokens: int, yielded: int = 0) -> None:
        self.embedded_inputs.labels(model).inc(inputs)
        self.embedded_tokens.labels(model).inc(tokens)
        self.embedding_yields.labels(model).inc(yielded)

    def embedding_abandoned(self, model: str) -> None:
        self.embeddings_abandoned.labels(model).inc()

    def recovered(self, outcomes: Iterable[tuple[str, str]]) -> None:
        """``(policy, outcome)`` for every task startup recovery moved or kept."""
        for policy, outcome in outcomes:
            self.recoveries.labels(policy, outcome).inc()

    def http(self, method: str, route: str, status: int, seconds: float) -> None:
        self.http_requests.labels(method, route, str(status)).inc()
        self.http_latency.labels(method, route).observe(seconds)

    # -- the exposition -------------------------------------------------------------------
    def add_collector(self, produce: Callable[[], Iterable[Metric]]) -> None:
        """Figures computed when scraped (read from the database)."""
        self.registry.register(_Callback(produce))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
