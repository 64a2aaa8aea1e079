"""Webhooks managed with the unchanged ``openai`` SDK (``client.webhooks.*``, served at
``/v1/webhook_endpoints``) against a real ``lmsp serve`` and a real receiver: create
(the secret shown once), list and retrieve (no secret), a background response's
``response.completed`` delivered and verified by ``client.webhooks.unwrap``, update,
rotate (the next delivery verifies with the new secret and not the old), test, delete;
an event type lmsp cannot send refused with nothing stored; another client's id 404."""

from __future__ import annotations

import json
import time
from pathlib import Path

import openai
import pytest
from openai import InvalidWebhookSignatureError, OpenAI

from tests.helpers import Server, open_db, served
from tests.webhook_receiver import Delivery, Receiver

pytestmark = pytest.mark.slow

FAST = {"LMSP_WEBHOOK_RETRY": "0.2s"}


def sdk(server: Server, token: str | None = None) -> OpenAI:
    # no retries: an error answer must surface, not be papered over
    return OpenAI(
        base_url=f"{server.url}/v1", api_key=token or server.token, max_retries=0, timeout=60
    )


def finish_in_background(client: OpenAI) -> str:
    made = client.responses.create(model="lmsp-test", input="hello", background=True)
    deadline = time.monotonic() + 60
    while client.responses.retrieve(made.id).status != "completed":
        assert time.monotonic() < deadline, "the response never completed"
        time.sleep(0.05)
    return made.id


def delivery_of(receiver: Receiver, response_id: str) -> Delivery:
    def about(d: Delivery) -> bool:
        return bool(json.loads(d.body)["data"]["id"] == response_id)

    receiver.wait_for(lambda got: any(about(d) for d in got))
    (delivery,) = [d for d in receiver.received() if about(d)]
    return delivery


def test_the_openai_sdk_manages_webhooks_end_to_end(tmp_path: Path) -> None:
    receiver = Receiver().start()
    try:
        with served(tmp_path / "data", env=FAST) as server, sdk(server) as client:
            made = client.webhooks.create(
                name="ends", url=receiver.url, event_types=["response.completed"]
            )
            assert made.object == "webhook_endpoint" and made.name == "ends"
            assert made.event_types == ["response.completed"] and made.url == receiver.url
            secret = made.signing_secret
            assert secret.startswith("whsec_")
            assert made.signing_secret_hint and made.signing_secret_hint.endswith(secret[-4:])

            listed = list(client.webhooks.list())
            assert [e.id for e in listed] == [made.id]
            shown = client.webhooks.retrieve(made.id)
            for endpoint in (*listed, shown):
                assert "signing_secret" not in endpoint.to_dict()
                assert endpoint.created_at == made.created_at
            # the lmsp face sees the same webhook
            with server.client() as http:
                assert http.get(f"/v1/webhooks/{made.id}").json()["description"] == "ends"

            # a background response's end, delivered and verified by the SDK
            first = finish_in_background(client)
            event = client.webhooks.unwrap(
                delivery_of(receiver, first).body,
                delivery_of(receiver, first).headers,
                secret=secret,
            )
            assert event.type == "response.completed" and event.data.id == first

            # update the URL and the name
            moved = receiver.url + "?moved"
            changed = client.webhooks.update(made.id, url=moved, name="moved ends")
            assert changed.url == moved and changed.name == "moved ends"
            assert client.webhooks.retrieve(made.id).url == moved

            # rotate: the next delivery verifies with the new secret, not the old
            rotated = client.webhooks.rotate_secret(made.id)
            fresh = rotated.signing_secret
            assert fresh.startswith("whsec_") and fresh != secret
            assert "signing_secret" not in client.webhooks.retrieve(made.id).to_dict()
            second = finish_in_background(client)
            delivery = delivery_of(receiver, second)
            assert delivery.path.endswith("?moved")
            event = client.webhooks.unwrap(delivery.body, delivery.headers, secret=fresh)
            assert event.type == "response.completed" and event.data.id == second
            with pytest.raises(InvalidWebhookSignatureError):
                client.webhooks.unwrap(delivery.body, delivery.headers, secret=secret)

            # a test event: signed with the current secret, its answer reported
            before = len(receiver.received())
            tested = client.webhooks.test(made.id, event_type="response.completed")
            assert tested.status_code == 200 and tested.success is True
            assert tested.webhook_endpoint_id == made.id
            probe = receiver.received()[before]
            assert client.webhooks.unwrap(probe.body, probe.headers, secret=fresh).type == (
                "response.completed"
            )

            # refusals: an event type lmsp cannot send, nothing stored
            with pytest.raises(openai.BadRequestError) as refused:
                client.webhooks.create(name="x", url=receiver.url, event_types=["batch.completed"])
            assert refused.value.status_code == 400
            assert refused.value.body["param"] == "event_types"  # type: ignore[index]
            with open_db(server.data_dir) as conn:
                assert conn.execute("SELECT count(*) FROM webhooks").fetchone()[0] == 1

            # another client's id: 404 on every verb
            with server.client() as http:
                other = http.post(
                    "/v1/clients",
                    json={"name": "other", "scopes": ["responses:read", "responses:write"]},
                ).json()["token"]
            with sdk(server, other) as stranger:
                assert list(stranger.webhooks.list()) == []
                for call in (
                    lambda: stranger.webhooks.retrieve(made.id),
                    lambda: stranger.webhooks.update(made.id, name="mine"),
                    lambda: stranger.webhooks.rotate_secret(made.id),
                    lambda: stranger.webhooks.test(made.id, event_type="response.completed"),
                    lambda: stranger.webhooks.delete(made.id),
                ):
                    with pytest.raises(openai.NotFoundError):
                        call()

            # delete: then 404
            deleted = client.webhooks.delete(made.id)
            assert deleted.deleted is True and deleted.object == "webhook_endpoint.deleted"
            with pytest.raises(openai.NotFoundError):
                client.webhooks.retrieve(made.id)
            assert client.webhooks.event_types.list().data == [
                "response.completed",
                "response.incomplete",
                "response.failed",
                "response.cancelled",
            ]
    finally:
        receiver.stop()
