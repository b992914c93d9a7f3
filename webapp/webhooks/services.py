"""Project webhooks: the owners' writes, the events that record a delivery for each hook subscribed to them, and
the sending of one delivery.

Design note. An event (a run ending, a pipeline ending, a dataset version's check settling) is recorded in the
transaction that made it happen: one ``WebhookDelivery`` per active hook that subscribed to it, and, on commit, a
``worker.tasks.webhooks.deliver_webhook`` task on the ``default`` queue per delivery. A rolled-back transaction
therefore records and sends nothing, and recording never fails its caller: ``event_record`` works in a savepoint and
logs what went wrong instead of raising, so a broken hook cannot fail a run. Runs are hooked in one place,
``runs.services.publish_status``, which every change of a run's status calls (``run_ended`` keeps the ends);
checkpoint exports in ``runs.services.checkpoint_export_finish``, serving copies in
``runs.serving_copies._copy_end`` (every end of a serving copy's row), review exports in ``review.services._export_end``
and evaluations in ``evals.services.evaluation_finish`` and ``evaluation_fail``, each when the end changes the row's
status (a redelivered report of the same end is no second end).

Sending (``delivery_attempt``) happens outside any transaction (a slow receiver holds no lock): the attempt is first
claimed with a conditional ``UPDATE`` of its count, so a message delivered twice sends once; then one POST, 10 s at
most, redirects not followed, only to an address ``network`` allows (one it refuses fails the delivery at once); a
2xx answer delivers it, anything else is tried again after ``RETRY_DELAYS`` (the task sent again with that countdown)
and, those spent, fails with the last status and error kept. Send test and Redeliver send at once from the page, so
that the owner sees the answer; their retries go to the worker as well.

Each hook keeps its newest ``DELIVERIES_KEPT`` deliveries: recording one deletes that hook's older ones
(``deliveries_trim``), so that the table stays bounded without a sweeper.
"""
from __future__ import annotations

import http.client
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.http import HttpRequest
from django.db.models import F, Q, Subquery
from django.utils import timezone
from kombu.exceptions import OperationalError

from webapp.activity.models import Verb
from webapp.activity.services import activity_record
from webapp.celery import app as celery_app
from webapp.projects.models import Project
from webapp.webhooks import network, payloads
from webapp.webhooks.models import (EVENTS, PING, DeliveryStatus, Webhook, WebhookDelivery, WebhookFormat,
                                    new_webhook_secret)

logger = logging.getLogger(__name__)

DELIVER_TASK = "worker.tasks.webhooks.deliver_webhook"
TIMEOUT_SECONDS = 10
# After the first attempt, one retry after each: then the delivery has failed.
RETRY_DELAYS = (timedelta(seconds=30), timedelta(minutes=5), timedelta(minutes=30))
RESPONSE_CHARS = 200
# A pending delivery this far past its time has lost its task's message: the reaper sends it again.
OVERDUE = timedelta(minutes=10)
URL_MAX = Webhook._meta.get_field("url").max_length
RUN_EVENTS = {"succeeded": "run.succeeded", "failed": "run.failed", "cancelled": "run.cancelled"}
# A checkpoint export's (exported) and a serving copy's (ready) ends, as events.
EXPORT_EVENTS = {"exported": "export.ready", "ready": "export.ready", "failed": "export.failed"}
# The fields of a hook whose change the activity log records; never its secret, whose value is the point.
LOGGED_FIELDS = ("url", "events", "format", "active")
# Deliveries kept per hook: a busy hook records one per event for as long as it exists, and nothing else deletes them.
DELIVERIES_KEPT = 200


# Owners' writes -------------------------------------------------------------------------------------


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be a webhook's address (None when it can): http or https, with a host."""
    if not url:
        return "give the address the messages are POSTed to, e.g. https://hooks.slack.com/services/…"
    if len(url) > URL_MAX:
        return f"the address is {len(url)} characters long; at most {URL_MAX} are taken"
    if any(character.isspace() or ord(character) < 32 for character in url):
        return "the address holds a space or a control character: paste it again as one piece"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (a port that is not a number raises here)
    except ValueError as error:
        return f"the address cannot be read ({error}): give one such as https://example.org/hooks/temper"
    if parts.scheme.lower() not in ("http", "https"):
        shown = f"{parts.scheme}:" if parts.scheme else "an address without http:// or https://"
        return f"only http:// and https:// addresses are taken, not {shown}: give the full address, e.g. https://…"
    if not parts.hostname:
        return "the address names no host: give the full address, e.g. https://example.org/hooks/temper"
    return network.literal_address_problem(parts.hostname)


SLACK_HOSTS = ("hooks.slack.com",)
DISCORD_HOSTS = ("discord.com", "discordapp.com")


def chat_format_problem(url: str, format: str) -> str | None:
    """Why a chat's incoming-webhook address cannot take messages of ``format`` (None when it can, or is no chat this
    knows): each answers what it cannot read with a 400, which Send test would show with no word of the cause."""
    parts = urlsplit(url)
    host, path = (parts.hostname or "").lower(), parts.path.rstrip("/")
    slack_format = WebhookFormat.SLACK.label.split(":")[0]
    if host in DISCORD_HOSTS and path.startswith("/api/webhooks/") and not path.endswith("/slack"):
        return (f"a Discord webhook takes Temper's messages only in Slack's format, at its address followed by /slack: "
                f"add /slack to the end of the address and choose {slack_format}")
    is_chat = ((host in SLACK_HOSTS and path.startswith("/services/"))
               or (host in DISCORD_HOSTS and path.startswith("/api/webhooks/")))
    if is_chat and format != WebhookFormat.SLACK:
        return (f"{host} incoming webhooks take only Slack's {{\"text\": …}} messages and refuse Temper's JSON: "
                f"choose the Slack format ({slack_format})")
    return None


def _checked(*, url: str, events: Sequence[str], format: str) -> tuple[str, list[str]]:
    url = url.strip()
    problems = {}
    if problem := url_problem(url):
        problems["url"] = problem
    elif problem := chat_format_problem(url, format):
        problems["format"] = problem
    unknown = sorted(set(events) - EVENTS.keys())
    if unknown or not events:
        problems["events"] = (f"unknown events {', '.join(unknown)}: choose among {', '.join(EVENTS)}" if unknown
                              else "tick at least one event to send")
    if format not in WebhookFormat.values:
        problems["format"] = f"{format!r} is not a format: choose {' or '.join(WebhookFormat.values)}"
    if problems:
        raise ValidationError(problems)
    return url, [event for event in EVENTS if event in events]  # in the form's order, once each


@transaction.atomic
def webhook_create(*, project: Project, url: str, events: Sequence[str], format: str, active: bool = True,
                   site_url: str = "", user: AbstractBaseUser | None) -> Webhook:
    """A new hook of ``project`` with a secret of its own; refused (nothing saved) with the problem by field."""
    url, events = _checked(url=url, events=events, format=format)
    webhook = Webhook.objects.create(project=project, url=url, events=events, format=format, active=active,
                                     site_url=site_url, created_by=user)
    activity_record(project=project, actor=user, verb=Verb.WEBHOOK_CREATED, target=webhook,
                    details={"events": events, "format": format, **({} if active else {"active": False})})
    return webhook


def edit_details(before: dict[str, Any], webhook: Webhook) -> dict[str, Any]:
    """The activity log's details of an edit: which of ``LOGGED_FIELDS`` changed from ``before``, with the new
    events, format and on/off; of a new address its host alone (every member reads the log)."""
    changed = [name for name in LOGGED_FIELDS if before[name] != getattr(webhook, name)]
    details: dict[str, Any] = {"changed": changed}
    if "url" in changed:
        details["host"] = webhook.host
    details.update({name: getattr(webhook, name) for name in changed if name != "url"})
    return details


@transaction.atomic
def webhook_update(*, webhook: Webhook, url: str, events: Sequence[str], format: str, active: bool,
                   user: AbstractBaseUser | None, site_url: str = "") -> Webhook:
    """Save an owner's edit; logged (which fields changed) when something did. The row is locked and read again, so
    that two owners' edits each log what they changed."""
    url, events = _checked(url=url, events=events, format=format)
    webhook = Webhook.objects.select_for_update(of=("self",)).select_related("project").get(pk=webhook.pk)
    before = {name: getattr(webhook, name) for name in LOGGED_FIELDS}
    webhook.url, webhook.events, webhook.format, webhook.active = url, events, format, active
    webhook.site_url = site_url or webhook.site_url
    webhook.save(update_fields=["url", "events", "format", "active", "site_url"])
    details = edit_details(before, webhook)
    if details["changed"]:
        activity_record(project=webhook.project, actor=user, verb=Verb.WEBHOOK_CHANGED, target=webhook,
                        details=details)
    return webhook


@transaction.atomic
def webhook_delete(*, webhook: Webhook, user: AbstractBaseUser | None) -> None:
    """The hook and its deliveries; a task sent for one of them finds it gone and does nothing."""
    activity_record(project=webhook.project, actor=user, verb=Verb.WEBHOOK_DELETED, target=webhook)
    webhook.delete()


@transaction.atomic
def webhook_secret_regenerate(*, webhook: Webhook, user: AbstractBaseUser | None) -> Webhook:
    """A new secret: messages sent from now on are signed with it (a retry too), the old one verifies none. Logged
    without either value."""
    webhook.secret = new_webhook_secret()
    webhook.save(update_fields=["secret"])
    activity_record(project=webhook.project, actor=user, verb=Verb.WEBHOOK_SECRET_REGENERATED, target=webhook)
    return webhook


# Events ----------------------------------------------------------------------------------------------


def event_record(*, project_id: int, event: str, describe: Callable[[], dict[str, Any]],
                 only: Webhook | None = None) -> list[WebhookDelivery]:
    """One pending delivery of ``event`` about the object ``describe()`` gives (a ``payloads.*_subject``, made only
    when some hook listens) per active hook of project ``project_id`` subscribed to it (``only``: that hook alone,
    whatever it subscribed to), each sent on commit. Never raises: a problem here is logged, and the transaction it
    was called in goes on without the deliveries."""
    try:
        with transaction.atomic():
            if only is not None:
                hooks = [only]
            else:
                hooks = [hook for hook in Webhook.objects.filter(project_id=project_id, active=True)
                         .select_related("project") if event in hook.events]
            if not hooks:
                return []
            recorded = payloads.payload(event=event, project_slug=hooks[0].project.slug, subject=describe(),
                                        occurred_at=timezone.now())
            deliveries = [WebhookDelivery.objects.create(webhook=hook, event=event, payload=recorded)
                          for hook in hooks]
            for hook in hooks:
                deliveries_trim(webhook_id=hook.pk)
    except Exception:
        logger.exception("project %s: the %s webhooks were not recorded", project_id, event)
        return []
    if only is None:  # Send test and Redeliver send at once, from the page
        for delivery in deliveries:
            _enqueue_on_commit(delivery.pk)
    return deliveries


def run_ended(*, run) -> list[WebhookDelivery]:
    """``run.succeeded``/``failed``/``cancelled`` for ``run`` (called by ``publish_status``; nothing for a run that has
    not ended)."""
    event = RUN_EVENTS.get(run.status)
    if event is None:
        return []
    return event_record(project_id=run.project_id, event=event, describe=lambda: payloads.run_subject(run))


def pipeline_ended(*, pipeline) -> list[WebhookDelivery]:
    return event_record(project_id=pipeline.project_id, event="pipeline.ended",
                        describe=lambda: payloads.pipeline_subject(pipeline))


def dataset_version_settled(*, version) -> list[WebhookDelivery]:
    """``dataset_version.ready`` or ``.failed``, once its check settled it."""
    return event_record(project_id=version.dataset.project_id, event=f"dataset_version.{version.status}",
                        describe=lambda: payloads.dataset_version_subject(version))


def checkpoint_export_ended(*, export) -> list[WebhookDelivery]:
    """``export.ready`` or ``.failed`` for a run's checkpoint export that ended (``runs.services
    .checkpoint_export_finish``)."""
    return event_record(project_id=export.run.project_id, event=EXPORT_EVENTS[export.status],
                        describe=lambda: payloads.checkpoint_export_subject(export))


def serving_copy_ended(*, copy) -> list[WebhookDelivery]:
    """``export.ready`` or ``.failed`` for a serving copy written, failed or given up (``runs.serving_copies
    ._copy_end``)."""
    return event_record(project_id=copy.project_id, event=EXPORT_EVENTS[copy.status],
                        describe=lambda: payloads.serving_copy_subject(copy))


def review_export_ended(*, export) -> list[WebhookDelivery]:
    """``review.exported`` for a review campaign's export that ended, done or failed (``review.services
    ._export_end``)."""
    return event_record(project_id=export.campaign.project_id, event="review.exported",
                        describe=lambda: payloads.review_export_subject(export))


def evaluation_ended(*, evaluation) -> list[WebhookDelivery]:
    """``evaluation.succeeded`` or ``.failed`` for an evaluation that ended so (``evals.services.evaluation_finish``,
    ``evaluation_fail``, each when its conditional update changed the row: a redelivered end is no second end)."""
    return event_record(project_id=evaluation.project_id, event=f"evaluation.{evaluation.status}",
                        describe=lambda: payloads.evaluation_subject(evaluation))


def project_renamed(*, project: Project, name_was: str, user: AbstractBaseUser | None) -> list[WebhookDelivery]:
    """``project.renamed`` for ``project``, renamed from ``name_was`` by ``user`` (None: manage.py), in the rename's
    transaction (``projects.services.project_update``)."""
    actor = user.get_username() if user is not None and user.is_authenticated else None
    return event_record(project_id=project.pk, event="project.renamed",
                        describe=lambda: payloads.project_renamed_subject(project, name_was=name_was, actor=actor))


def webhook_ping(*, webhook: Webhook, now: datetime | None = None) -> WebhookDelivery:
    """Send test: a ``ping`` delivery to ``webhook``, sent at once (its retries, if it fails, by the worker)."""
    deliveries = event_record(project_id=webhook.project_id, event=PING,
                              describe=lambda: payloads.webhook_subject(webhook), only=webhook)
    if not deliveries:
        raise ValidationError({"__all__": "the test message could not be recorded: the server's log says why"})
    return delivery_attempt(delivery_id=deliveries[0].pk, now=now)


def delivery_redeliver(*, delivery: WebhookDelivery, now: datetime | None = None) -> WebhookDelivery:
    """A new delivery of ``delivery``'s recorded payload to its hook, sent at once (the hook's current address,
    format and secret)."""
    copy = WebhookDelivery.objects.create(webhook=delivery.webhook, event=delivery.event, payload=delivery.payload)
    deliveries_trim(webhook_id=delivery.webhook_id)
    return delivery_attempt(delivery_id=copy.pk, now=now)


def deliveries_trim(*, webhook_id: int, keep: int = DELIVERIES_KEPT) -> int:
    """Delete hook ``webhook_id``'s deliveries older than its newest ``keep`` (newest by id: ids grow as they are
    recorded); how many went. One DELETE bounded by the id of the first delivery past ``keep``, found in a
    subquery: no row is read into Python however many there are (nothing refers to a delivery, so Django deletes
    without collecting them first)."""
    first_past_kept = WebhookDelivery.objects.filter(webhook_id=webhook_id).order_by("-pk").values("pk")[keep:keep + 1]
    deleted, _by_model = WebhookDelivery.objects.filter(webhook_id=webhook_id,
                                                        pk__lte=Subquery(first_past_kept)).delete()
    return deleted


# Sending ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Answer:
    status_code: int | None  # None: no HTTP answer at all
    error: str
    excerpt: str
    final: bool = False  # trying again would not help: fail the delivery now


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, req, fp, code, msg, headers, newurl):
        return None  # the 3xx is the hook's answer: a redirect could lead the signed message anywhere


def _excerpt(response) -> str:
    try:
        return response.read(RESPONSE_CHARS * 4).decode("utf-8", errors="replace")[:RESPONSE_CHARS]
    except (OSError, http.client.HTTPException):
        return ""


def http_post(url: str, *, body: bytes, headers: dict[str, str], timeout: float = TIMEOUT_SECONDS) -> Answer:
    """POST ``body`` to ``url``, redirects not followed: the answer's status and first characters, or why none came."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), network.GuardedHTTPHandler,
                                         network.GuardedHTTPSHandler, _NoRedirects)
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with opener.open(request, timeout=timeout) as response:
            return Answer(status_code=response.status, error="", excerpt=_excerpt(response))
    except urllib.error.HTTPError as error:
        excerpt = _excerpt(error)
        if 300 <= error.code < 400:
            where = error.headers.get("Location", "elsewhere")
            return Answer(error.code, f"HTTP {error.code}: redirected to {where}, which webhooks do not follow; give "
                                      "the address it redirects to", excerpt)
        return Answer(error.code, f"HTTP {error.code} {error.reason}", excerpt)
    except urllib.error.URLError as error:
        reason = error.reason
        if isinstance(reason, network.AddressRefused):
            return Answer(None, f"not sent: {reason}", "", final=True)
        if isinstance(reason, TimeoutError):
            return Answer(None, f"no answer within {timeout:g} s", "")
        return Answer(None, f"could not connect: {reason}", "")
    except TimeoutError:
        return Answer(None, f"no answer within {timeout:g} s", "")
    except (OSError, http.client.HTTPException, ValueError) as error:
        return Answer(None, f"{type(error).__name__}: {error}", "")


def served_at(request: HttpRequest) -> str:
    """The address this request (a page's, or the REST API's) came to: the links of the hook's messages start with it
    (``base_url``)."""
    return request.build_absolute_uri("/").rstrip("/")


def base_url(webhook: Webhook) -> str:
    """Where links in ``webhook``'s messages start: ``TEMPER_BASE_URL``, else the address the pages were served at
    when an owner saved the hook."""
    return settings.TEMPER_BASE_URL or webhook.site_url


def delivery_attempt(*, delivery_id: int, now: datetime | None = None,
                     delays: Sequence[timedelta] = RETRY_DELAYS) -> WebhookDelivery | None:
    """Send pending delivery ``delivery_id`` once (see the module note); ``now`` and ``delays`` are the clock and
    the backoff, which tests pass. Returns the delivery as it stands after, or None when it is gone."""
    now = now or timezone.now()
    delivery = WebhookDelivery.objects.select_related("webhook__project").filter(pk=delivery_id).first()
    if delivery is None or delivery.status != DeliveryStatus.PENDING:
        return delivery
    if delivery.next_attempt_at is not None and delivery.next_attempt_at > now + timedelta(seconds=5):
        return delivery  # an early copy of a retry's message: the retry's own comes at its time
    webhook = delivery.webhook
    if not WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING,
                                          attempts=delivery.attempts).update(attempts=F("attempts") + 1):
        return WebhookDelivery.objects.filter(pk=delivery.pk).first()  # another process took this attempt
    attempts = delivery.attempts + 1
    if not webhook.active and delivery.event != PING:  # Send test is how an owner checks a hook before turning it on
        answer = Answer(None, "not sent: the webhook is turned off", "")
        delays = ()
    else:
        sent = payloads.absolute(delivery.payload, base_url=base_url(webhook), sent_at=now,
                                 delivery_id=delivery.public_id)
        body = payloads.body(sent, format=webhook.format)
        timestamp = str(int(now.timestamp()))
        answer = http_post(webhook.url, body=body, headers=payloads.headers(
            event=delivery.event, delivery_id=delivery.public_id, secret=webhook.secret, timestamp=timestamp,
            body=body))
    outcome = _outcome(answer, attempts=attempts, now=now, delays=delays)
    WebhookDelivery.objects.filter(pk=delivery.pk, attempts=attempts).update(
        last_status_code=answer.status_code, last_error=answer.error[:300], last_response=answer.excerpt, **outcome)
    if outcome["next_attempt_at"] is not None:
        _send(delivery.pk, countdown=(outcome["next_attempt_at"] - now).total_seconds())
    if answer.error:
        logger.info("webhook %s delivery %s (%s), attempt %d: %s", webhook.public_id, delivery.public_id,
                    delivery.event, attempts, answer.error)
    return WebhookDelivery.objects.filter(pk=delivery.pk).first()


def _outcome(answer: Answer, *, attempts: int, now: datetime, delays: Sequence[timedelta]) -> dict[str, Any]:
    if answer.status_code is not None and 200 <= answer.status_code < 300:
        return {"status": DeliveryStatus.DELIVERED, "next_attempt_at": None}
    if attempts <= len(delays) and not answer.final:
        return {"status": DeliveryStatus.PENDING, "next_attempt_at": now + delays[attempts - 1]}
    return {"status": DeliveryStatus.FAILED, "next_attempt_at": None}


def deliveries_resend_overdue(*, now: datetime | None = None) -> list[WebhookDelivery]:
    """Send again the task of each pending delivery ``OVERDUE`` past its time (every worker's reaper calls this):
    its message was lost (Redis restarted, a send that failed) or the queue is that far behind. A copy that finds the
    attempt taken or not yet due sends nothing, so a late original and this copy send once."""
    now = now or timezone.now()
    late = now - OVERDUE
    overdue = list(WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).filter(
        Q(next_attempt_at__lt=late) | Q(next_attempt_at__isnull=True, created_at__lt=late)))
    resent = []
    for delivery in overdue:
        # Its new time, so that the next rounds leave it alone for OVERDUE; only where no attempt moved it meanwhile.
        if WebhookDelivery.objects.filter(pk=delivery.pk, status=DeliveryStatus.PENDING,
                                          attempts=delivery.attempts).update(next_attempt_at=now):
            _send(delivery.pk)
            logger.warning("webhook delivery %s (%s) was overdue; its task was sent again", delivery.public_id,
                           delivery.event)
            resent.append(delivery)
    return resent


def _send(delivery_pk: int, *, countdown: float | None = None) -> None:
    try:
        later = {"countdown": countdown} if countdown else {}
        celery_app.send_task(DELIVER_TASK, args=[delivery_pk], queue="default", **later)
    except OperationalError:
        # The delivery stays pending; its page offers Redeliver.
        logger.exception("could not queue webhook delivery %s: is Redis (REDIS_URL) up?", delivery_pk)


def _enqueue_on_commit(delivery_pk: int) -> None:
    transaction.on_commit(lambda: _send(delivery_pk))
