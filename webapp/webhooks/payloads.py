"""What a webhook message says, as pure functions of the rows it is about: the object described (``*_subject``),
Temper's JSON payload, the Slack text, and the request's body and signed headers.

A payload is recorded when the event happens (``WebhookDelivery.payload``, what the page shows and Redeliver sends
again) with links relative to the site; each attempt makes them absolute with the hook's base address and stamps
``sent_at``, so a retry half an hour later says when it was sent, and its signature covers that very body."""
from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Any

from django.urls import reverse

PAYLOAD_VERSION = 1
USER_AGENT = "Temper-Webhooks/1"
SLACK_DETAIL_CHARS = 300

# The object's kind in a sentence: "Run <link|name> failed".
KIND_WORDS = {"run": "Run", "pipeline": "Pipeline", "dataset_version": "Dataset version", "webhook": "Webhook",
              "checkpoint_export": "Checkpoint export", "serving_copy": "Serving copy",
              "review_export": "Export of review campaign", "evaluation": "Evaluation", "project": "Project"}


def run_subject(run) -> dict[str, Any]:
    """A run that ended: its final metrics (last, min, max, step of each), how long since its launch and how long it
    trained, and why it failed or was cancelled."""
    duration = (run.finished_at - run.created_at).total_seconds() if run.finished_at and run.created_at else None
    return {"type": "run", "id": run.public_id, "name": run.name, "status": run.status, "task": run.task,
            "path": reverse("runs:detail", args=[run.project.slug, run.public_id]),
            "final_metrics": run.final_metrics or {}, "step": run.current_step, "total_steps": run.total_steps,
            "duration_seconds": round(duration, 1) if duration is not None else None,
            "train_seconds": round(run.train_seconds, 1),
            "error": run.error_message if run.status != "succeeded" else ""}


def pipeline_subject(pipeline) -> dict[str, Any]:
    return {"type": "pipeline", "id": pipeline.public_id, "name": pipeline.name, "status": pipeline.status,
            "path": reverse("runs:pipeline", args=[pipeline.project.slug, pipeline.public_id]),
            "message": pipeline.message,
            "result_run": pipeline.result_run.public_id if pipeline.result_run_id else None,
            "error": pipeline.message if pipeline.status != "succeeded" else ""}


def dataset_version_subject(version) -> dict[str, Any]:
    dataset = version.dataset
    first_error = (version.errors or [{}])[0].get("message", "") if version.status == "failed" else ""
    return {"type": "dataset_version", "id": version.public_id, "name": f"{dataset.name} v{version.number}",
            "status": version.status, "dataset": dataset.public_id, "kind": dataset.kind,
            "path": reverse("datasets:version", args=[dataset.project.slug, dataset.public_id, version.number]),
            "row_count": version.row_count, "error_count": version.error_count, "error": first_error}


def checkpoint_export_subject(export) -> dict[str, Any]:
    """A run's checkpoint export that ended: ``exported`` (``model``: the ref other runs start from) or ``failed``."""
    run, exported = export.run, export.status == "exported"
    return {"type": "checkpoint_export", "id": f"{run.public_id}@{export.step}",
            "name": f"{run.name} checkpoint {export.step}", "status": export.status, "run": run.public_id,
            "step": export.step, "model": f"{run.public_id}@{export.step}" if exported else None,
            "path": reverse("runs:detail", args=[run.project.slug, run.public_id]),
            "error": "" if exported else export.error_message}


def serving_copy_subject(copy) -> dict[str, Any]:
    """A serving copy that was written (``ready``) or failed: of a run's checkpoint (``step``), of its final model
    (``step`` null) or of a base model, in ``scheme``; linking to the page that shows it."""
    if copy.run_id is not None:
        run = copy.run
        source_id = run.public_id if copy.step is None else f"{run.public_id}@{copy.step}"
        name = f"{run.name} {'final model' if copy.step is None else f'checkpoint {copy.step}'} ({copy.scheme})"
        path = reverse("runs:detail", args=[run.project.slug, run.public_id])
    else:
        base_model = copy.base_model
        source_id, name = base_model.public_id, f"{base_model.name} ({copy.scheme})"
        path = reverse("basemodels:detail", args=[base_model.project.slug, base_model.public_id])
    return {"type": "serving_copy", "id": source_id, "name": name, "status": copy.status, "scheme": copy.scheme,
            "run": copy.run.public_id if copy.run_id else None, "step": copy.step,
            "base_model": copy.base_model.public_id if copy.base_model_id else None, "path": path,
            "error": copy.error_message if copy.status != "ready" else ""}


def review_export_subject(export) -> dict[str, Any]:
    """A review campaign's export that ended: ``done`` (``dataset_version``: the version it made, ready to train
    on) or ``failed``."""
    campaign, version = export.campaign, export.version if export.status == "done" else None
    return {"type": "review_export", "id": campaign.public_id, "name": campaign.name, "status": export.status,
            "dataset": export.dataset_name,
            "dataset_version": ({"id": version.public_id, "name": f"{version.dataset.name} v{version.number}"}
                                if version is not None else None),
            "path": reverse("review:detail", args=[campaign.project.slug, campaign.public_id]),
            "error": export.error if export.status != "done" else ""}


def evaluation_subject(evaluation) -> dict[str, Any]:
    """An evaluation that ended: ``succeeded`` (``value`` of ``metric`` over ``count`` rows) or ``failed``
    (``error``); its name says which model on which version, as its page does."""
    succeeded = evaluation.status == "succeeded"
    version = evaluation.dataset_version
    return {"type": "evaluation", "id": evaluation.public_id, "name": str(evaluation), "status": evaluation.status,
            "model": evaluation.model_ref, "dataset_version": version.public_id if version is not None else None,
            "metric": evaluation.metric, "reward_terms": evaluation.reward_terms,
            "value": evaluation.result.get("value") if succeeded else None,
            "count": evaluation.result.get("count") if succeeded else None,
            "path": reverse("evals:detail", args=[evaluation.project.slug, evaluation.public_id]),
            "error": "" if succeeded else evaluation.error}


def project_renamed_subject(project, *, name_was: str, actor: str | None) -> dict[str, Any]:
    """A project an owner renamed: its new ``name``, ``name_was`` and the ``actor``'s username (None: manage.py). Its
    id is the slug, which a rename leaves as it is."""
    return {"type": "project", "id": project.slug, "name": project.name, "status": "renamed", "name_was": name_was,
            "actor": actor, "path": reverse("projects:detail", args=[project.slug]), "error": ""}


def webhook_subject(webhook) -> dict[str, Any]:
    """Send test's object: the hook itself, linking to the project's Webhooks page."""
    return {"type": "webhook", "id": webhook.public_id, "name": "test message", "status": "active" if webhook.active
            else "inactive", "path": reverse("webhooks:list", args=[webhook.project.slug]), "error": ""}


def payload(*, event: str, project_slug: str, subject: dict[str, Any], occurred_at: datetime) -> dict[str, Any]:
    """Temper's payload as recorded, before ``sent_at`` and the absolute links."""
    return {"version": PAYLOAD_VERSION, "event": event, "occurred_at": occurred_at.isoformat(),
            "project": project_slug, "object": subject}


def absolute(recorded: dict[str, Any], *, base_url: str, sent_at: datetime, delivery_id: str) -> dict[str, Any]:
    """The payload as sent: its object's ``path`` made a ``url`` on ``base_url``, ``sent_at`` and the delivery's id
    (also the ``X-Temper-Delivery`` header) stamped."""
    subject = dict(recorded["object"])
    subject["url"] = base_url.rstrip("/") + subject.pop("path", "")
    return {**recorded, "sent_at": sent_at.isoformat(), "delivery": delivery_id, "object": subject}


def slack_escaped(text: str) -> str:
    """Text shown as text in Slack's markup: its three control characters escaped, as Slack documents."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_text(sent: dict[str, Any]) -> str:
    """One line with a link: "[alpha] Run <https://…|first> failed: ValueError: …"."""
    subject = sent["object"]
    kind = KIND_WORDS.get(subject["type"], subject["type"])
    link = f"<{slack_escaped(subject['url'])}|{slack_escaped(subject['name'])}>"
    if sent["event"] == "ping":
        return f"[{slack_escaped(sent['project'])}] Temper webhook test: this hook works ({link})"
    line = f"[{slack_escaped(sent['project'])}] {kind} {link} {slack_escaped(subject['status'])}"
    if subject["type"] == "review_export" and (made := subject["dataset_version"]):  # a review export done: the version to train on, as the JSON names it
        line += f": dataset version {slack_escaped(made['name'])}"
    if subject["type"] == "evaluation" and subject["value"] is not None:  # what it scored, the point of the message
        line += f": {evaluation_score_words(subject)}"
    if "name_was" in subject:  # a rename: from what, and by whom
        line += f": was {slack_escaped(subject['name_was'])}"
        if subject["actor"]:
            line += f", by {slack_escaped(subject['actor'])}"
    detail = " ".join(subject.get("error", "").split())  # one line, whatever the error held
    if detail:
        cut = detail[:SLACK_DETAIL_CHARS] + ("…" if len(detail) > SLACK_DETAIL_CHARS else "")
        line += f": {slack_escaped(cut)}"
    return line


def evaluation_score_words(subject: dict[str, Any]) -> str:
    """An evaluation object's score as a chat reads it: "exact match 0.5000", "loss 1.2345"; by reward functions the
    mean of their weighted total and how many they were, "mean reward 1.500 (2 functions)" ("rewards 1.5000" read as
    a count of rewards)."""
    if subject["metric"] == "rewards":
        count = len(subject.get("reward_terms") or ())
        return f"mean reward {subject['value']:.3f} ({count} function{'s' if count != 1 else ''})"
    return f"{slack_escaped(subject['metric'].replace('_', ' '))} {subject['value']:.4f}"


def body(sent: dict[str, Any], *, format: str) -> bytes:
    document = {"text": slack_text(sent)} if format == "slack" else sent
    return json.dumps(document, ensure_ascii=False, separators=(",", ":")).encode()


def signature(secret: str, *, timestamp: str, body: bytes) -> str:
    """``sha256=<hex>`` of HMAC-SHA256 with the hook's secret over ``timestamp + "." + body``: a receiver recomputes
    it (README, Webhooks) and refuses an old timestamp, so a message captured once cannot be replayed later."""
    digest = hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"sha256={digest}"


def headers(*, event: str, delivery_id: str, secret: str, timestamp: str, body: bytes) -> dict[str, str]:
    return {"Content-Type": "application/json", "User-Agent": USER_AGENT, "X-Temper-Event": event,
            "X-Temper-Delivery": delivery_id, "X-Temper-Timestamp": timestamp,
            "X-Temper-Signature": signature(secret, timestamp=timestamp, body=body)}
