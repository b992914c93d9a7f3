"""Project webhooks, end to end against a real HTTP server (``receiver.Receiver``): each way a run, a pipeline and a
dataset version ends sends its event once, signed, to the hooks subscribed to it only; retries with the clock passed
in; refusals on save; the owners-only page."""
from __future__ import annotations

import json
import socket
from datetime import timedelta
from ipaddress import ip_address, ip_network

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from tests.webapp.factories import make_base_model, make_ready_version
from tests.webapp.webhooks.conftest import SITE, hook
from tests.webapp.webhooks.receiver import verified
from webapp.datasets import services as dataset_services
from webapp.datasets.models import DatasetVersion, VersionStatus
from webapp.runs import pipelines, reporting
from webapp.runs import services as run_services
from webapp.runs.models import RunStatus
from webapp.webhooks import network, services
from webapp.webhooks.models import DeliveryStatus, Webhook, WebhookDelivery


def spec(project) -> dict:
    """A run's spec on the project's one base model and dataset version, made the first time."""
    model = project.base_models.first() or make_base_model(project)
    version = DatasetVersion.objects.filter(dataset__project=project, status=VersionStatus.READY).first()
    version = version or make_ready_version(project)
    return {"task": "sft", "model": model.public_id, "data": {"train": version.public_id}, "train": {"max_steps": 10}}


@pytest.fixture
def running_run(team, sent, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        run = run_services.run_create(project=team.project, spec=spec(team.project), user=team.owner, name="first")
    return reporting.run_start(run_pk=run.pk, attempt=1, worker_name="train@test")


def test_a_run_failing_in_the_worker_is_sent_once_signed_to_the_hooks_subscribed_only(
        team, receiver, running_run, django_capture_on_commit_callbacks):
    failing = hook(team.project, receiver, "/failed", ["run.failed"])
    hook(team.project, receiver, "/succeeded", ["run.succeeded"])
    hook(team.outsider_project, receiver, "/elsewhere", ["run.failed"])  # another project's hook hears nothing
    Webhook.objects.create(project=team.project, url=receiver.url + "/off", events=["run.failed"], active=False)

    with django_capture_on_commit_callbacks(execute=True):
        reporting.run_fail(run=running_run, error=ValueError("data.train: no usable rows"))

    assert [received.path for received in receiver.requests] == ["/failed"]
    received = receiver.requests[0]
    assert verified(failing.secret, received)
    assert not verified("whsec_not-the-secret", received)
    delivery = WebhookDelivery.objects.get(webhook=failing)
    assert received.headers["Content-Type"] == "application/json"
    assert received.headers["User-Agent"] == "Temper-Webhooks/1"
    assert received.headers["X-Temper-Event"] == "run.failed"
    assert received.headers["X-Temper-Delivery"] == delivery.public_id
    message = received.json
    assert (message["event"], message["project"], message["delivery"]) == ("run.failed", "alpha", delivery.public_id)
    assert message["object"]["id"] == running_run.public_id and message["object"]["name"] == "first"
    assert message["object"]["status"] == "failed" and message["object"]["task"] == "sft"
    assert message["object"]["url"] == f"{SITE}/p/alpha/runs/{running_run.public_id}/"
    assert message["object"]["error"] == "ValueError: data.train: no usable rows"
    assert message["object"]["duration_seconds"] >= 0 and "final_metrics" in message["object"]
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (DeliveryStatus.DELIVERED, 1, 200)
    assert len(delivery.last_response) == 200  # the answer's first 200 characters, not its 500 and more


def test_a_run_succeeding_and_runs_cancelled_queued_or_by_the_worker_send_their_event_once(
        team, receiver, sent, django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/ended", ["run.succeeded", "run.failed", "run.cancelled"])
    events = []

    def launched():
        with django_capture_on_commit_callbacks(execute=True):
            return run_services.run_create(project=team.project, spec=spec(team.project), user=team.owner)

    queued = launched()
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_cancel(run=queued, user=team.owner)
    events.append(("run.cancelled", queued.public_id))
    for status in ("cancelled", "succeeded"):
        run = reporting.run_start(run_pk=launched().pk, attempt=1, worker_name="train@test")
        with django_capture_on_commit_callbacks(execute=True):
            reporting.run_finish(run=run, summary={"status": status, "step": 3})
        events.append((f"run.{status}", run.public_id))
    # A second report of the same end (a redelivered message) is not a second end.
    with django_capture_on_commit_callbacks(execute=True):
        reporting.run_finish(run=run, summary={"status": "succeeded", "step": 3})

    assert [(received.json["event"], received.json["object"]["id"]) for received in receiver.requests] == events
    assert receiver.requests[0].json["object"]["error"] == "cancelled by alpha-owner before it started"


def test_a_pipeline_ending_sends_pipeline_ended(team, receiver, sent, django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/pipelines", ["pipeline.ended"])
    document = {"name": "chain", "stages": [{"name": "sft", "spec": spec(team.project)}]}
    with django_capture_on_commit_callbacks(execute=True):
        pipeline = pipelines.pipeline_create(project=team.project, document=document, user=team.owner)
    with django_capture_on_commit_callbacks(execute=True):
        pipelines.pipeline_cancel(pipeline=pipeline, user=team.owner)
    # Its stage's run, cancelled with it, has no hook of its own here: one message, the pipeline's.
    assert [received.json["event"] for received in receiver.requests] == ["pipeline.ended"]
    sent_object = receiver.requests[0].json["object"]
    assert (sent_object["id"], sent_object["status"]) == (pipeline.public_id, "cancelled")
    assert sent_object["url"] == f"{SITE}/p/alpha/pipelines/{pipeline.public_id}/"


def uploaded_version(team, rows: list[dict]) -> DatasetVersion:
    version = make_ready_version(team.project, rows=rows)
    DatasetVersion.objects.filter(pk=version.pk).update(status=VersionStatus.UPLOADED)
    return version


def test_a_dataset_versions_check_sends_ready_or_failed_to_the_hooks_subscribed(
        team, receiver, sent, django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/ready", ["dataset_version.ready"])
    hook(team.project, receiver, "/failed", ["dataset_version.failed"])
    good = uploaded_version(team, [{"prompt": "q", "completion": "a"}])
    bad = uploaded_version(team, [{"question": "no prompt here"}])

    for version in (good, bad, good):  # the third: a redelivered check of a settled version sends nothing
        with django_capture_on_commit_callbacks(execute=True):
            dataset_services.dataset_version_validate(version_id=version.pk)

    assert [received.path for received in receiver.requests] == ["/ready", "/failed"]
    ready, failed = (received.json["object"] for received in receiver.requests)
    assert (ready["id"], ready["status"], ready["row_count"]) == (good.public_id, "ready", 1)
    assert (failed["id"], failed["status"]) == (bad.public_id, "failed") and "prompt" in failed["error"]


def test_nothing_is_recorded_or_sent_for_a_rolled_back_transaction(team, receiver, sent, running_run,
                                                                   django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/failed", ["run.failed"])
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        with pytest.raises(RuntimeError), transaction.atomic():
            reporting.run_fail(run=running_run, error=ValueError("boom"))
            raise RuntimeError("the caller's transaction fails after the run's")
    assert callbacks == [] and receiver.requests == []
    assert not WebhookDelivery.objects.exists()
    running_run.refresh_from_db()
    assert running_run.status == RunStatus.RUNNING


def test_a_500_is_retried_after_the_backoff_and_then_delivered(team, receiver, sent):
    receiver.statuses = [500]
    webhook = hook(team.project, receiver, "/flaky", ["run.failed"])
    delivery, = services.event_record(project_id=team.project.pk, event="run.failed", describe=lambda: {
        "type": "run", "id": "run_x", "name": "x", "status": "failed", "path": "/p/alpha/runs/run_x/", "error": "e"})
    start = timezone.now()
    delays = (timedelta(seconds=30), timedelta(minutes=5))

    first = services.delivery_attempt(delivery_id=delivery.pk, now=start, delays=delays)
    assert (first.status, first.attempts, first.last_status_code) == (DeliveryStatus.PENDING, 1, 500)
    assert first.next_attempt_at == start + timedelta(seconds=30) and first.last_error.startswith("HTTP 500")
    assert sent[-1] == (services.DELIVER_TASK, [delivery.pk], "default", {"countdown": 30.0})

    early = services.delivery_attempt(delivery_id=delivery.pk, now=start + timedelta(seconds=10), delays=delays)
    assert early.attempts == 1 and len(receiver.requests) == 1  # not due: the retry's own message comes at its time

    second = services.delivery_attempt(delivery_id=delivery.pk, now=start + timedelta(seconds=31), delays=delays)
    assert (second.status, second.attempts, second.last_status_code) == (DeliveryStatus.DELIVERED, 2, 200)
    assert second.last_error == "" and second.next_attempt_at is None
    assert [received.headers["X-Temper-Delivery"] for received in receiver.requests] == [delivery.public_id] * 2
    assert all(verified(webhook.secret, received) for received in receiver.requests)
    # Delivered is settled: a late copy of the message sends nothing more.
    services.delivery_attempt(delivery_id=delivery.pk, now=start + timedelta(minutes=9), delays=delays)
    assert len(receiver.requests) == 2


def test_each_failed_attempt_is_retried_until_the_delays_are_spent_then_it_fails(team, receiver, sent):
    receiver.statuses = [503, 503, 503]
    hook(team.project, receiver, "/down", ["run.failed"])
    delivery, = services.event_record(project_id=team.project.pk, event="run.failed", describe=lambda: {
        "type": "run", "id": "run_x", "name": "x", "status": "failed", "path": "/", "error": ""})
    start, delays = timezone.now(), (timedelta(seconds=30), timedelta(seconds=30))
    for attempt in range(3):
        delivery = services.delivery_attempt(delivery_id=delivery.pk, now=start + attempt * timedelta(seconds=31),
                                             delays=delays)
    assert len(receiver.requests) == 3
    assert (delivery.status, delivery.attempts, delivery.last_status_code) == (DeliveryStatus.FAILED, 3, 503)
    assert delivery.next_attempt_at is None


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_an_unreachable_address_fails_with_the_error(team, sent):
    webhook = services.webhook_create(project=team.project, url=f"http://127.0.0.1:{closed_port()}/hook",
                                      events=["run.failed"], format="json", user=team.owner)
    delivery, = services.event_record(project_id=team.project.pk, event="run.failed", describe=lambda: {
        "type": "run", "id": "run_x", "name": "x", "status": "failed", "path": "/", "error": ""})
    delivery = services.delivery_attempt(delivery_id=delivery.pk, delays=())
    assert delivery.webhook == webhook and delivery.status == DeliveryStatus.FAILED
    assert delivery.last_status_code is None
    assert delivery.last_error.startswith("could not connect:") and "refused" in delivery.last_error


def test_a_redirect_is_not_followed(team, receiver, sent):
    receiver.statuses = [302]
    webhook = hook(team.project, receiver, "/moved", ["run.failed"])
    delivery = services.webhook_ping(webhook=webhook)
    assert [received.path for received in receiver.requests] == ["/moved"]  # /elsewhere was never asked
    assert delivery.status == DeliveryStatus.PENDING and delivery.last_status_code == 302
    assert "redirected to" in delivery.last_error and "do not follow" in delivery.last_error


def test_the_slack_format_sends_one_line_with_a_link_its_text_escaped(team, receiver, sent,
                                                                      django_capture_on_commit_callbacks):
    hook(team.project, receiver, "/slack", ["run.cancelled"], format="slack")
    with django_capture_on_commit_callbacks(execute=True):
        run = run_services.run_create(project=team.project, spec=spec(team.project), user=team.owner,
                                      name="<b>a&b</b>")
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_cancel(run=run, user=team.owner)
    assert receiver.requests[0].json == {"text": (
        f"[alpha] Run <{SITE}/p/alpha/runs/{run.public_id}/|&lt;b&gt;a&amp;b&lt;/b&gt;> cancelled: "
        "cancelled by alpha-owner before it started")}


@pytest.mark.parametrize("url", ["ftp://example.org/hook", "javascript:alert(1)", "example.org/hook", "https://",
                                 "http://exa mple.org/", ""])
def test_it_rejects_an_address_that_is_not_http_or_https_naming_the_field(team, url):
    with pytest.raises(ValidationError) as refused:
        services.webhook_create(project=team.project, url=url, events=["run.failed"], format="json", user=None)
    assert list(refused.value.message_dict) == ["url"]
    assert not Webhook.objects.exists()


def test_it_rejects_no_events_and_unknown_ones(team):
    for events, said in (([], "tick at least one"), (["run.exploded"], "unknown events run.exploded")):
        with pytest.raises(ValidationError) as refused:
            services.webhook_create(project=team.project, url="https://example.org/", events=events, format="json",
                                    user=None)
        assert said in refused.value.message_dict["events"][0]


@pytest.mark.parametrize(("url", "format", "said"), [
    ("https://hooks.slack.com/services/T0/B0/abc", "json", "choose the Slack format"),
    ("https://discord.com/api/webhooks/1/abc", "slack", "add /slack to the end of the address"),
    ("https://discordapp.com/api/webhooks/1/abc", "json", "add /slack to the end of the address"),
    ("https://discord.com/api/webhooks/1/abc/slack", "json", "choose the Slack format"),
])
def test_it_rejects_a_chat_address_with_a_format_the_chat_refuses_saying_what_to_choose(team, url, format, said):
    """QA (an owner setting up Slack): a Slack incoming webhook saved with the default JSON format answered every
    message with 400 (Slack takes {"text": …} only), the page's Send test saying no more than that; Discord takes
    Slack's format only at its address + /slack."""
    with pytest.raises(ValidationError) as refused:
        services.webhook_create(project=team.project, url=url, events=["run.failed"], format=format, user=None)
    assert said in refused.value.message_dict["format"][0]
    assert not Webhook.objects.exists()
    for fine_url, fine_format in (("https://hooks.slack.com/services/T0/B0/abc", "slack"),
                                  ("https://discord.com/api/webhooks/1/abc/slack", "slack"),
                                  ("https://hooks.slack.com/triggers/T0/1/abc", "json")):  # a workflow takes JSON
        services.webhook_create(project=team.project, url=fine_url, events=["run.failed"], format=fine_format,
                                user=None)


# The page --------------------------------------------------------------------------------------------


def test_the_page_is_the_owners_members_get_403_and_outsiders_404(team, client_for):
    path = "/p/alpha/webhooks/"
    assert client_for(team.owner).get(path).status_code == 200
    assert client_for(team.teammate).get(path).status_code == 403
    assert client_for(team.viewer).get(path).status_code == 403
    assert client_for(team.outsider).get(path).status_code == 404
    webhook = services.webhook_create(project=team.project, url="https://example.org/", events=["run.failed"],
                                      format="json", user=None)
    # Another project's owner cannot reach this one's hook through their own project either.
    theirs = client_for(team.outsider).post(f"/p/alpha-elsewhere/webhooks/{webhook.public_id}/delete/")
    assert theirs.status_code == 404 and Webhook.objects.filter(pk=webhook.pk).exists()


def test_an_owner_adds_a_hook_and_a_bad_address_is_refused_on_the_page_saving_nothing(team, client_for):
    owner = client_for(team.owner)
    refused = owner.post("/p/alpha/webhooks/", {"url": "file:///etc/passwd", "events": ["run.failed"],
                                                "format": "json", "active": "on"})
    assert refused.status_code == 400 and "only http:// and https:// addresses are taken" in refused.content.decode()
    assert not Webhook.objects.exists()
    added = owner.post("/p/alpha/webhooks/", {"url": "https://example.org/hook", "events": ["run.failed"],
                                              "format": "slack", "active": "on"})
    webhook = Webhook.objects.get()
    assert added.status_code == 302 and added["Location"] == f"/p/alpha/webhooks/#{webhook.public_id}"
    assert (webhook.events, webhook.format, webhook.site_url) == (["run.failed"], "slack", "http://testserver")


def test_deliveries_show_escaped_and_a_new_secret_replaces_the_old(team, client_for, receiver, sent):
    webhook = hook(team.project, receiver, "/x", ["run.failed"])
    WebhookDelivery.objects.create(webhook=webhook, event="run.failed", payload={"object": {"name": "<i>run</i>"}},
                                   last_error="<script>alert(1)</script>", status=DeliveryStatus.FAILED)
    page = client_for(team.owner).get("/p/alpha/webhooks/").content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert "&lt;i&gt;run&lt;/i&gt;" in page and webhook.secret in page
    # A failed delivery stands out as a failed run does in the runs table: a red badge.
    assert '<span class="badge status-failed badge-error" data-status="failed">failed</span>' in page
    old = webhook.secret
    client_for(team.owner).post(f"/p/alpha/webhooks/{webhook.public_id}/secret/")
    webhook.refresh_from_db()
    assert webhook.secret != old and webhook.secret.startswith("whsec_")


def test_redeliver_sends_the_recorded_payload_again_as_a_new_delivery(team, client_for, receiver, sent):
    receiver.statuses = [500]
    webhook = hook(team.project, receiver, "/again", ["run.failed"])
    first = services.webhook_ping(webhook=webhook)
    assert first.status == DeliveryStatus.PENDING
    answer = client_for(team.owner).post(
        f"/p/alpha/webhooks/{webhook.public_id}/deliveries/{first.public_id}/redeliver/", follow=True)
    assert "ping sent again delivered: HTTP 200." in answer.content.decode()
    bodies = [json.loads(received.body) for received in receiver.requests]
    assert [body["event"] for body in bodies] == ["ping", "ping"]
    assert bodies[0]["delivery"] != bodies[1]["delivery"] and bodies[0]["object"] == bodies[1]["object"]


def test_runs_lost_for_good_and_external_runs_send_their_end_once(team, receiver, running_run, settings,
                                                                  django_capture_on_commit_callbacks):
    """The other ways a run ends (the reaper's verdicts, an external run's close) pass the same one place."""
    hook(team.project, receiver, "/ended", ["run.succeeded", "run.failed", "run.cancelled"])
    settings.TEMPER_RUN_LOST_LIMIT = 1
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_attempt_lost(run=running_run, why="silent for 600 s")
    external = run_services.run_create_external(project=team.project, name="outside", config={}, user=team.owner)
    with django_capture_on_commit_callbacks(execute=True):
        run_services.run_finish_external(run=external, status="succeeded")
    assert [(received.json["event"], received.json["object"]["id"]) for received in receiver.requests] == [
        ("run.failed", running_run.public_id), ("run.succeeded", external.public_id)]
    assert receiver.requests[0].json["object"]["error"].startswith("lost 1 times in a row")


def test_a_failure_to_record_the_event_never_fails_the_run(team, receiver, running_run, monkeypatch, caplog,
                                                          django_capture_on_commit_callbacks):
    """A bug in describing the run (injected here) is logged; the run's end is recorded all the same."""
    hook(team.project, receiver, "/failed", ["run.failed"])

    def broken(run):
        raise KeyError("a field the payload expected")

    monkeypatch.setattr("webapp.webhooks.payloads.run_subject", broken)
    with django_capture_on_commit_callbacks(execute=True):
        reporting.run_fail(run=running_run, error=ValueError("boom"))
    running_run.refresh_from_db()
    assert running_run.status == RunStatus.FAILED and running_run.error_message == "ValueError: boom"
    assert receiver.requests == [] and not WebhookDelivery.objects.exists()
    assert "the run.failed webhooks were not recorded" in caplog.text


def test_a_delivery_whose_message_was_lost_is_sent_again_by_the_reaper_once(team, receiver, sent):
    hook(team.project, receiver, "/late", ["run.failed"])
    delivery, = services.event_record(project_id=team.project.pk, event="run.failed", describe=lambda: {
        "type": "run", "id": "run_x", "name": "x", "status": "failed", "path": "/", "error": ""})
    # Its on-commit task never ran (this test's transaction does not commit): as if Redis had lost it.
    WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=timezone.now() - timedelta(minutes=9))
    assert services.deliveries_resend_overdue() == []
    WebhookDelivery.objects.filter(pk=delivery.pk).update(created_at=timezone.now() - timedelta(minutes=11))
    assert [late.pk for late in services.deliveries_resend_overdue()] == [delivery.pk]
    assert [received.path for received in receiver.requests] == ["/late"]
    assert WebhookDelivery.objects.get(pk=delivery.pk).status == DeliveryStatus.DELIVERED
    assert services.deliveries_resend_overdue() == []


def test_an_owner_edits_a_hook_a_bad_address_changing_nothing_and_deletes_it_with_its_deliveries(team, client_for):
    owner = client_for(team.owner)
    webhook = services.webhook_create(project=team.project, url="https://example.org/a", events=["run.failed"],
                                      format="json", user=team.owner)
    WebhookDelivery.objects.create(webhook=webhook, event="run.failed", payload={})
    path = f"/p/alpha/webhooks/{webhook.public_id}/"
    assert 'value="https://example.org/a"' in owner.get(path).content.decode()
    refused = owner.post(path, {"url": "gopher://example.org/", "events": ["run.failed"], "format": "json"})
    assert refused.status_code == 400 and "not gopher:" in refused.content.decode()
    webhook.refresh_from_db()
    assert (webhook.url, webhook.active) == ("https://example.org/a", True)
    saved = owner.post(path, {"url": " https://example.org/b ", "events": ["pipeline.ended", "run.cancelled"],
                              "format": "slack"})  # "active" unticked
    webhook.refresh_from_db()
    assert saved.status_code == 302
    assert (webhook.url, webhook.events, webhook.format, webhook.active) == (
        "https://example.org/b", ["run.cancelled", "pipeline.ended"], "slack", False)
    owner.post(f"{path}delete/")
    assert not Webhook.objects.exists() and not WebhookDelivery.objects.exists()


# Where messages may go ----------------------------------------------------------------------------------


@pytest.mark.parametrize("address, allowed", [
    ("93.184.216.34", True), ("2606:4700::1111", True), ("8.8.8.8", True),
    ("127.0.0.1", False), ("::1", False), ("10.1.2.3", False), ("172.16.0.1", False), ("192.168.1.10", False),
    ("169.254.169.254", False), ("fe80::1", False), ("fc00::1", False), ("100.64.0.1", False), ("0.0.0.0", False),
    ("224.0.0.251", False), ("::ffff:127.0.0.1", False), ("::ffff:10.0.0.1", False), ("192.0.2.1", False),
])
def test_only_public_addresses_are_allowed_by_default(address, allowed):
    assert network.address_allowed(ip_address(address), ()) is allowed


def test_a_listed_network_is_allowed_and_others_stay_refused():
    listed = (ip_network("10.0.0.0/8"), ip_network("fd00::/8"))
    assert network.address_allowed(ip_address("10.9.8.7"), listed)
    assert network.address_allowed(ip_address("::ffff:10.9.8.7"), listed)  # the same host written as IPv6
    assert network.address_allowed(ip_address("fd12::1"), listed)
    assert not network.address_allowed(ip_address("192.168.0.1"), listed)
    assert not network.address_allowed(ip_address("169.254.169.254"), listed)


@pytest.mark.parametrize("url, said", [
    ("http://127.0.0.1:8000/hook", "127.0.0.1 is at 127.0.0.1 (loopback)"),
    ("http://169.254.169.254/latest/meta-data/", "169.254.169.254 (link-local)"),
    ("http://[::1]/hook", "::1 is at ::1 (loopback)"),
    ("https://10.0.0.5/hooks", "10.0.0.5 (private)"),
])
def test_saving_a_hook_at_a_non_public_address_is_refused_naming_the_setting(team, settings, url, said):
    settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS = ()
    with pytest.raises(ValidationError) as refused:
        services.webhook_create(project=team.project, url=url, events=["run.failed"], format="json", user=None)
    problem, = refused.value.message_dict["url"]
    assert said in problem and "TEMPER_WEBHOOK_ALLOWED_NETWORKS" in problem
    assert not Webhook.objects.exists()


def test_a_name_resolving_to_a_non_public_address_is_refused_when_sent_and_not_retried(team, settings, receiver):
    # Saved while its network was allowed (or while the name pointed elsewhere): judged again at each connection.
    webhook = hook(team.project, receiver, "/inside", events=["run.failed"])
    webhook.url = webhook.url.replace("127.0.0.1", "localhost")
    webhook.save(update_fields=["url"])
    settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS = ()
    delivery, = services.event_record(project_id=team.project.pk, event="run.failed", describe=lambda: {
        "type": "run", "id": "run_x", "name": "x", "status": "failed", "path": "/", "error": ""})
    delivery = services.delivery_attempt(delivery_id=delivery.pk)  # the default backoff: it would be retried
    assert delivery.status == DeliveryStatus.FAILED and delivery.attempts == 1 and delivery.next_attempt_at is None
    assert delivery.last_error.startswith("not sent: localhost is at ")
    assert "(loopback)" in delivery.last_error and "TEMPER_WEBHOOK_ALLOWED_NETWORKS" in delivery.last_error
    assert receiver.requests == []


def test_a_hook_keeps_its_newest_deliveries_and_the_older_go_in_one_delete(team, receiver, sent):
    """Deliveries were never deleted: a hook on a busy project grew its table by one row per event for good. Recording
    one now deletes the hook's deliveries past the newest DELIVERIES_KEPT, in one DELETE, and no other hook's."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    busy, other = hook(team.project, receiver, "/busy", ["run.failed"]), hook(team.project, receiver, "/o", ["run.failed"])
    for webhook in (busy, other):
        WebhookDelivery.objects.bulk_create(WebhookDelivery(webhook=webhook, event="run.failed", payload={"n": number})
                                            for number in range(services.DELIVERIES_KEPT))
    with CaptureQueriesContext(connection) as queries:
        ping = services.webhook_ping(webhook=busy)
    deletes = [query["sql"] for query in queries if query["sql"].lstrip().upper().startswith("DELETE")]
    assert len(deletes) == 1, deletes
    kept = list(busy.deliveries.order_by("pk").values_list("payload", flat=True))
    assert len(kept) == services.DELIVERIES_KEPT and kept[0] == {"n": 1}  # the oldest went
    assert busy.deliveries.filter(pk=ping.pk).exists() and other.deliveries.count() == services.DELIVERIES_KEPT
    # Redeliver records a delivery too: the next oldest goes.
    services.delivery_redeliver(delivery=ping)
    assert busy.deliveries.count() == services.DELIVERIES_KEPT
    assert busy.deliveries.order_by("pk").values_list("payload", flat=True).first() == {"n": 2}


def test_the_page_reads_as_much_for_twenty_hooks_of_twenty_deliveries_as_for_one(team, client_for,
                                                                                 django_assert_num_queries):
    """QA (page speed): each hook's deliveries and its author were read one hook at a time; with 20 hooks the page
    made 40 more queries than with one."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    def hooks(count: int) -> None:
        for index in range(count):
            webhook = services.webhook_create(project=team.project, url=f"https://example.org/hook/{index}",
                                              events=["run.failed"], format="json", site_url=SITE, user=team.owner)
            WebhookDelivery.objects.bulk_create(
                WebhookDelivery(webhook=webhook, event="run.failed", payload={"object": {"name": f"run {number}"}},
                                status=DeliveryStatus.DELIVERED, attempts=1, last_status_code=200)
                for number in range(25))

    owner = client_for(team.owner)
    hooks(1)
    owner.get("/p/alpha/webhooks/")  # the first load over (sessions read)
    with CaptureQueriesContext(connection) as for_one:
        owner.get("/p/alpha/webhooks/")
    hooks(19)
    with django_assert_num_queries(len(for_one)):
        page = owner.get("/p/alpha/webhooks/").content.decode()
    assert page.count('<tr data-delivery="') == 20 * 20  # the newest 20 of each hook's 25
    assert page.count("by alpha-owner") == 20


def test_the_page_says_how_many_deliveries_a_hook_has_and_where_the_older_ones_are(team, client_for):
    """The page showed each hook's newest 20 with no word that up to 200 are kept: the older ones looked gone."""
    busy = services.webhook_create(project=team.project, url="https://example.org/busy", events=["run.failed"],
                                   format="json", user=team.owner)
    quiet = services.webhook_create(project=team.project, url="https://example.org/quiet", events=["run.failed"],
                                    format="json", user=team.owner)
    for webhook, count in ((busy, 25), (quiet, 3)):
        WebhookDelivery.objects.bulk_create(WebhookDelivery(webhook=webhook, event="run.failed", payload={})
                                            for _number in range(count))
    page = client_for(team.owner).get("/p/alpha/webhooks/").content.decode()
    busy_part, quiet_part = page.split(f'id="{quiet.public_id}"')
    assert (f"20 of 25 shown; the older ones: <code>GET /api/v1/projects/alpha/webhooks/{busy.public_id}/deliveries/"
            "</code>") in busy_part
    assert " of 3 shown" not in quiet_part and "the older ones" not in quiet_part


def test_the_edit_page_heading_names_the_hooks_host_escaped(team, client_for):
    """The heading said only "Webhook wh_…": with several hooks, which one was being edited was told by the id alone."""
    webhook = services.webhook_create(project=team.project, url="https://hooks.example.org/services/T0/B0",
                                      events=["run.failed"], format="json", user=team.owner)
    page = client_for(team.owner).get(f"/p/alpha/webhooks/{webhook.public_id}/").content.decode()
    assert f"<h1>Webhook {webhook.public_id} to hooks.example.org</h1>" in page
    Webhook.objects.filter(pk=webhook.pk).update(url="https://<b>x</b>.example/")  # as no form saves it
    page = client_for(team.owner).get(f"/p/alpha/webhooks/{webhook.public_id}/").content.decode()
    assert "to &lt;b&gt;x&lt;" in page and "<b>x" not in page



def test_the_admin_index_spells_webhook_deliveries(client_for):
    from django.contrib.auth import get_user_model

    client = client_for(get_user_model().objects.create_superuser("root", password="unused-password"))
    page = client.get("/admin/").content.decode()
    assert "Webhook deliveries" in page and "deliverys" not in page


def test_the_admin_site_shows_deliveries_read_only(team, client_for):
    """A delivery is the record of what was sent where and what the receiver answered (the Webhooks page lists it and
    Redeliver sends its payload again): changed in the admin site, the record would say what never happened."""
    from django.contrib.auth import get_user_model

    webhook = services.webhook_create(project=team.project, url="https://example.org/hook", events=["run.failed"],
                                      format="json", user=team.owner)
    delivery = WebhookDelivery.objects.create(webhook=webhook, event="run.failed", payload={"object": {"id": "run_x"}},
                                              status="failed", last_status_code=500)
    client = client_for(get_user_model().objects.create_superuser("root", password="unused-password"))
    change = f"/admin/webhooks/webhookdelivery/{delivery.pk}/change/"
    page = client.get(change).content.decode()
    assert "run_x" in page and 'name="status"' not in page
    assert client.post(change, {"webhook": webhook.pk, "event": "run.succeeded", "payload": "{}", "status": "sent",
                                "attempts": 1, "last_status_code": 200}).status_code == 403
    assert client.post(f"/admin/webhooks/webhookdelivery/{delivery.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/webhooks/webhookdelivery/add/").status_code == 403
    delivery.refresh_from_db()
    assert (delivery.event, delivery.status, delivery.last_status_code) == ("run.failed", "failed", 500)


def test_the_admin_site_shows_hooks_read_only(team, client_for):
    """QA: saved, added or deleted in the admin site, a hook skipped webhook_create/update/delete: its address was not
    checked, its events could be any text, it could move to another project, and the project's activity log, where
    every change of where its data goes is recorded, said nothing."""
    from django.contrib.auth import get_user_model

    from webapp.activity.models import Activity, Verb

    webhook = services.webhook_create(project=team.project, url="https://example.org/hook", events=["run.failed"],
                                      format="json", user=team.owner)
    client = client_for(get_user_model().objects.create_superuser("root", password="unused-password"))
    change = f"/admin/webhooks/webhook/{webhook.pk}/change/"
    page = client.get(change).content.decode()
    assert page.count("https://example.org/hook") and 'name="url"' not in page and "/p/alpha/webhooks/" in page
    assert client.post(change, {"url": "http://169.254.169.254/", "events": '["anything"]', "format": "json",
                                "project": team.outsider_project.pk, "active": "on"}).status_code == 403
    assert client.post(f"/admin/webhooks/webhook/{webhook.pk}/delete/", {"post": "yes"}).status_code == 403
    assert client.get("/admin/webhooks/webhook/add/").status_code == 403
    webhook.refresh_from_db()
    assert (webhook.url, webhook.events, webhook.project_id) == ("https://example.org/hook", ["run.failed"],
                                                                 team.project.pk)
    assert list(Activity.objects.filter(verb__startswith="webhook.").values_list("verb", flat=True)) == [
        Verb.WEBHOOK_CREATED]
