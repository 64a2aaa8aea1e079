"""Two ``lmsp serve`` nodes on one PostgreSQL database share a remote model and its work:
the model is added once (its record, upstream and capabilities are in the shared
database; its tokenizer, the bundled GGUF, is in every node's blob store), responses
created on either node are run by both against the one upstream (``llama-server`` on
loopback, :mod:`tests.upstream`), and each is the upstream's own greedy answer."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from tests.helpers import check_log_invariants
from tests.pgcluster import Cluster
from tests.remote_fixtures import MODEL, add, decoded, final, output_text, prompt_tokens
from tests.test_scale_out import client, node, reader
from tests.upstream import Upstream

pytestmark = pytest.mark.slow

SUBJECTS = ["a lighthouse", "a harbour", "a storm", "a gull", "a ferry", "a reef"]


def test_a_node_pair_on_postgresql_shares_a_remote_model_and_its_work(
    tmp_path: Path, pg_cluster: Cluster
) -> None:
    upstream = Upstream(tmp_path / "llama-server.log", parallel=4).start()
    url = pg_cluster.database()
    a = node(tmp_path, url, "a")
    b = node(tmp_path, url, "b")
    try:
        a.extra_env["LMSP_PARALLEL"] = "1"
        b.extra_env["LMSP_PARALLEL"] = "1"
        a.start()
        b.start()
        token = a.token
        with client(a, token) as ha, client(b, token) as hb:
            ha.timeout = hb.timeout = 300
            add(ha, upstream, inflight=2)
            assert hb.get(f"/v1/models/{MODEL}").json()["remote"]["url"] == upstream.url
            made: list[tuple[str, str]] = []
            for i, subject in enumerate(SUBJECTS):
                http = ha if i % 2 == 0 else hb
                text = f"Write two sentences about {subject}."
                body = {
                    "model": MODEL,
                    "input": text,
                    "background": True,
                    "temperature": 0,
                    "max_output_tokens": 32,
                }
                created = http.post("/v1/responses", json=body)
                assert created.status_code == 202, created.text
                made.append((created.json()["id"], text))
            done = {rid: final(ha, rid) for rid, _ in made}
        for rid, text in made:
            assert done[rid]["status"] in ("completed", "incomplete"), done[rid]
            assert output_text(done[rid]) == decoded(upstream.greedy(prompt_tokens(text), 32))
        conn = reader(url)
        try:
            ran = {row[0] for row in conn.execute("SELECT DISTINCT node_id FROM tasks")}
            check_log_invariants(conn)
        finally:
            conn.close()
        assert {"a", "b"} <= ran, ran
    finally:
        for srv in (a, b):
            if srv.proc is not None:
                os.kill(srv.proc.pid, signal.SIGCONT)
            srv.stop()
        upstream.stop()
