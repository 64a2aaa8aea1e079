"""``lmsp pull hf.co/{owner}/{repo}:{quant} [--id ID]``: a model by name, as a durable
task of the running service, with a progress bar that follows it to its end.

The download is the service's task, not this command's: interrupting the command
(Ctrl-C) leaves it running, and running the same command again follows the same pull
(the service answers the unfinished pull of a reference instead of starting another).
Exit status 0 once the model is registered; 1 with one ``Error: …`` line otherwise.
"""

from __future__ import annotations

import time
from typing import Any

import click
import httpx
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)

from lmsp.cli.errors import CliError
from lmsp.cli.remote import connect, print_json, remote_options, size
from lmsp.client import Client

progress_console = Console(stderr=True)
#: the hub is asked about the reference before the service answers
PULL_TIMEOUT = httpx.Timeout(120.0, connect=5.0)
POLL = 0.5


@click.command("pull", short_help="Download a model from the hub (hf.co/owner/repo:QUANT).")
@click.argument("reference")
@click.option("--id", "model_id", help="The id to serve the model under.")
@remote_options
def pull(
    reference: str, model_id: str | None, url: str | None, token: str | None, as_json: bool
) -> None:
    """Pull a GGUF model from the hub as a durable task and wait for it.

    REFERENCE is hf.co/{owner}/{repo}:{quant}, e.g.
    hf.co/bartowski/Qwen2.5-7B-Instruct-GGUF:Q4_K_M. Interrupting this command leaves
    the download running in the service; run it again to follow it. Without --id the
    model is served as owner/repo:QUANT.
    """
    body: dict[str, Any] = {"from": reference}
    if model_id:
        body["id"] = model_id
    with connect(url, token) as api:
        started = api.request("POST", "/v1/models/pull", json=body, timeout=PULL_TIMEOUT)
        task_id = started["task"]["id"]
        name = started["model"]
        try:
            final = _follow(api, task_id, name, quiet=as_json)
        except KeyboardInterrupt:
            raise CliError(
                f"stopped following; the pull goes on in the service (task {task_id}): "
                f"run `lmsp pull {reference}` again to follow it",
                "interrupted",
            ) from None
        if final["status"] != "completed":
            error = final.get("error") or {}
            raise CliError(
                str(error.get("message") or f"the pull ended {final['status']}"),
                str(error.get("code") or final["status"]),
            )
        model = api.request("GET", f"/v1/models/{name}")
    if as_json:
        print_json(model)
        return
    meta = model.get("metadata") or {}
    click.echo(
        f"pulled {model['id']}: {model['digest']} ({size(model['size_bytes'])}"
        f"{', ' + str(meta['quantization']) if meta.get('quantization') else ''})"
    )


def _follow(api: Client, task_id: str, name: str, quiet: bool) -> dict[str, Any]:
    """Follow the task's events (``model.pull.progress``) until it ends; its last state."""
    after = -1
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=progress_console,
        disable=quiet,
    )
    with bar:
        line = bar.add_task(f"pulling {name}", total=None)
        while True:
            page = api.request(
                "GET",
                f"/v1/tasks/{task_id}/events",
                params={"after": after},
                headers={"Accept": "application/json"},
            )
            for event in page["data"]:
                after = event["sequence_number"]
                if event["type"] == "model.pull.progress":
                    bar.update(line, total=event["total"], completed=event["bytes"])
            if page.get("has_more"):
                continue
            task: dict[str, Any] = api.request("GET", f"/v1/tasks/{task_id}")
            if task["status"] in ("completed", "failed", "cancelled"):
                return task
            time.sleep(POLL)
