"""The composition root: open the running service (the data directory, the cluster,
startup recovery), wire its parts (runner, downloader, model host, webhook sender,
membership, metric collectors), start them, keep retention sweeping, and stop them in
order. Whatever carries requests (HTTP: :mod:`lmsp.api.app`) opens the service here
and hands it to the use cases."""

from __future__ import annotations

import asyncio
import logging

from lmsp import datadir
from lmsp.app import figures
from lmsp.app.broker import Broker
from lmsp.app.service import Service
from lmsp.cluster.startup import HeadStart, head_start
from lmsp.config import Settings
from lmsp.outbound.deliverer import Deliverer, DeliveryPolicy
from lmsp.outbound.pull import Downloader
from lmsp.protocol.webhooks import parse_hosts
from lmsp.runner import retention
from lmsp.runner.runner import Runner

log = logging.getLogger("lmsp")


def open_service(
    settings: Settings, lock: datadir.DataDirLock | None = None, head: HeadStart | None = None
) -> Service:
    """Open the data directory, join the cluster if there is one and run startup
    recovery (blocking), or take over ``head``, which ``lmsp serve`` did all that with
    before its imports (:mod:`lmsp.cluster.startup`). Closing ``db`` releases the lock;
    :class:`lmsp.datadir.DataDirBusy` if another process holds it."""
    if head is None:
        head = head_start(settings, lock)
    db, host, metrics, service_id = head.db, head.host, head.metrics, head.service_id
    report, membership = head.report, head.membership
    log.info(
        "recovered: %d failed, %d cancelled, %d requeued, %d resumed",
        len(report.failed),
        len(report.cancelled),
        len(report.requeued),
        len(report.resumed),
    )
    metrics.recovered(report.outcomes)
    runner = Runner(
        db,
        host,
        parallel=settings.parallel,
        reserved=settings.reserved_sequences,
        flush_interval=settings.flush_interval,
        metrics=metrics,
    )
    runner.pulls = Downloader(
        db,
        settings.data_dir,
        settings.hf_endpoint,
        settings.hf_token,
        node=settings.node if db.shared else "",
        metrics=metrics,
    )
    if membership is not None:
        membership.attach(runner)
        membership.start()  # the lease is renewed from now on (it ends with the database)
        db.on_task_change(runner.heard)
    figures.collect(metrics, db, host)
    service = Service(
        settings, db, host, runner, service_id, report, metrics, kv=host.load.prefix_files
    )
    service.membership = membership
    runner.grammars = service.grammars  # an MCP loop's schemas: the API's budget
    policy = DeliveryPolicy(
        settings.webhook_retry, settings.webhook_give_up, parse_hosts(settings.webhook_hosts)
    )
    service.webhooks = Deliverer(db, policy, settings.node if db.shared else None)
    return service


async def start(svc: Service) -> None:
    """Start the service's work (on the running event loop): every commit wakes the
    broker's waiters, the runner claims tasks (resuming those recovery left running),
    the webhook sender delivers."""
    svc.broker = Broker(asyncio.get_running_loop())
    svc.db.on_commit(svc.broker.notify)
    svc.runner.start(resume=svc.recovered.resumed)
    if svc.webhooks is not None:
        await asyncio.to_thread(svc.webhooks.start)


async def stop(svc: Service) -> None:
    """Stop in order: the webhook sender, the runner, the lease, the readers, the
    engines, and last the database (its lock released)."""
    if svc.webhooks is not None:
        await asyncio.to_thread(svc.webhooks.stop)
    await asyncio.to_thread(svc.runner.stop)
    if svc.membership is not None:
        await asyncio.to_thread(svc.membership.stop)
    svc.close_readers()
    svc.host.close()
    svc.db.close()


async def collect_garbage(svc: Service) -> retention.Swept:
    """One retention sweep (:mod:`lmsp.runner.retention`), off the event loop."""
    return await asyncio.to_thread(
        retention.sweep,
        svc.db,
        svc.settings.retention,
        kv=svc.kv,
        conversations=svc.settings.conversation_retention or None,
    )


async def sweep_forever(svc: Service) -> None:
    """Sweep every ``LMSP_GC_INTERVAL`` until cancelled; a failed sweep is logged."""
    while True:
        await asyncio.sleep(svc.settings.gc_interval)
        try:
            swept = await collect_garbage(svc)
            if swept.responses or swept.idempotency_keys or swept.pairing_requests:
                log.info(
                    "retention: %d responses, %d keys, %d pairing requests",
                    swept.responses,
                    swept.idempotency_keys,
                    swept.pairing_requests,
                )
            if swept.conversations:
                log.info("retention: %d unused conversations", swept.conversations)
            if swept.kv_bytes:
                log.info("retention: %d bytes of saved prefixes", swept.kv_bytes)
        except Exception:
            log.exception("retention sweep failed")
