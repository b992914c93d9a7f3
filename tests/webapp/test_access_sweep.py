"""Every URL of a project, swept: the access rule holds for all of them, not only where a view's own
tests remembered to check it.

Design note. ``ROUTES`` names every URL pattern that reaches a project, a project's object or a
user's token, with how to fill its arguments from a populated project (``World``) and the least
role each HTTP method takes; ``EXEMPT`` names the patterns that take no project and no object, each
with its reason. ``test_the_table_covers_every_url_pattern`` walks Django's resolver, so a new
pattern fails the suite until someone says here how it is reached and who may use it. The rule:

- an outsider gets 404 for every method the view takes, and for every method exactly what they get
  for a project that does not exist; nothing of the project shows in any answer, nothing changes,
  nothing is queued;
- an anonymous user is sent to log in (the token APIs answer 401);
- a member below the role a method needs gets 403 (a project token of a member who became a viewer
  stops working, and says so: 403 too); an object private to its author (a conversation, a battle, a token) is
  answered to anyone else exactly as a missing one;
- and, so that none of that passes by missing the object, a user with the least role (the author,
  for private objects) reaches every method of every URL: the view found the object;
- every method but GET of a page (and the forms that name no project) is refused without the CSRF token,
  changing nothing: only the token APIs are exempt.

``REFERENCES`` does the same for ids named in a query or a body (a run's model and data, the runs
to compare): sent by the outsider in their own project, the team project's are refused as missing
ones are, and the outsider's own are taken.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from ipaddress import ip_network
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync, iscoroutinefunction
from django.apps import apps
from django.conf import settings
from django.db import transaction
from django.test import AsyncClient, Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver, resolve, reverse

from tests.webapp.factories import Team, make_base_model, make_ready_version
from webapp.api.services import token_create
from webapp.celery import app as celery_app
from webapp.chat import arena
from webapp.chat import selectors as chat_selectors
from webapp.chat import services as chat_services
from webapp.chat.tokens import project_token_create
from webapp.evals import services as evaluation_services
from webapp.projects.models import Membership, Role
from webapp.review import services as review_services
from webapp.runs import pipelines
from webapp.runs import services as run_services
from webapp.runs.models import Artifact, ArtifactKind
from webapp.webhooks import services as webhook_services
from webapp.webhooks.models import WebhookDelivery
from webapp.webhooks.payloads import payload as webhook_payload
from webapp.webhooks.payloads import run_subject

METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
GHOST_SLUG = "no-such-project"
GHOST_NUMBER = 999_999
# A private conversation's text: another member's answer must not carry it.
PRIVATE_TEXT = "private-turn-of-the-teammate"
# Fields that change on a read by design: the last use of a token, the last login.
VOLATILE_FIELDS = {"last_used_at", "last_login"}


class Auth(Enum):
    SESSION = "session"  # the pages: cookie login
    API_TOKEN = "api token"  # /api/v1/: a user's token (tmp_…)
    PROJECT_TOKEN = "project token"  # /v1/ (OpenAI): a member's token for one project (tpk_…)


@dataclass(frozen=True, kw_only=True)
class World:
    """A project with one of everything, made by its members; ``secrets`` holds each user's
    tokens by kind."""

    team: Team
    base_model: Any
    sft: Any
    run: Any
    pipeline: Any
    campaign: Any
    item: Any
    evaluation: Any
    conversation: Any
    message: Any
    battle: Any
    webhook: Any
    delivery: Any
    spare_project_token: Any
    spare_api_token: Any
    secrets: dict[tuple[Auth, str], str]

    @property
    def slug(self) -> str:
        return self.team.project.slug

    def markers(self) -> set[str]:
        """What would show that an answer leaked the project: its name, its members' names and
        every object's id."""
        objects = [self.base_model, self.sft, self.sft.dataset, self.run, self.pipeline, self.campaign, self.item,
                   self.evaluation, self.conversation, self.message, self.battle, self.battle.side_a, self.battle.side_b,
                   self.webhook, self.delivery]
        team = self.team
        return ({obj.public_id for obj in objects} | {team.project.name, PRIVATE_TEXT}
                | {user.get_username() for user in (team.owner, team.teammate, team.viewer)})

    def named(self) -> set[str]:
        """What an outsider's 404 must not show although the address names it: the project's slug and the names
        of its objects (the 404 page shows the view's message, which for an outsider must be that of a project
        that does not exist)."""
        objects = [self.base_model, self.sft.dataset, self.run, self.pipeline, self.campaign]
        return {self.slug} | {obj.name for obj in objects}

    def outsiders_own(self, body: str) -> str:
        """``body`` without the outsider's own names (their user name and project's slug, which the page's header
        shows and which hold the project's slug: "alpha-outsider")."""
        for own in (self.team.outsider.get_username(), self.team.outsider_project.slug):
            body = body.replace(own, "")
        return body


@dataclass(frozen=True, kw_only=True)
class Route:
    """How to reach one URL pattern: ``methods`` maps each HTTP method the view takes to the least
    project role that may use it; ``kwargs``/``query``/``body`` fill the request from a ``World``;
    ``private`` when the object is the teammate's own (a member's), hidden from everyone else.
    ``queues_a_generation``: an OpenAI completion, which answers once the serve worker's first event is
    in Redis; the world has no Redis, so reaching it means its 503 saying so (after the token, the body
    and the model were accepted and the generation was queued)."""

    methods: dict[str, str]
    kwargs: Callable[[World], dict[str, Any]] = lambda world: {}
    query: Callable[[World], str] = lambda world: ""
    body: Callable[[World], dict[str, Any]] | None = None
    auth: Auth = Auth.SESSION
    private: bool = False
    queues_a_generation: bool = False


def names_project(kwargs: dict, body: dict | None) -> bool:
    """Whether a request names the project or one of its objects (an outsider gets 404), not only the
    caller's own things (their REST token, their token's project's models)."""
    return "slug" in kwargs or body is not None


def _project(world):
    return {"slug": world.slug}


def _dataset(world):
    return {"slug": world.slug, "public_id": world.sft.dataset.public_id}


def _version(world):
    return {**_dataset(world), "number": world.sft.number}


def _base_model(world):
    return {"slug": world.slug, "public_id": world.base_model.public_id}


def _run(world):
    return {"slug": world.slug, "run_id": world.run.public_id}


def _pipeline(world):
    return {"slug": world.slug, "pipeline_id": world.pipeline.public_id}


def _campaign(world):
    return {"slug": world.slug, "public_id": world.campaign.public_id}


def _evaluation(world):
    return {"slug": world.slug, "public_id": world.evaluation.public_id}


def _api_evaluation(world):
    return {"slug": world.slug, "evaluation_id": world.evaluation.public_id}


def _item(world):
    return {**_campaign(world), "item_id": world.item.public_id}


def _battle(world):
    return {"slug": world.slug, "battle_id": world.battle.public_id}


def _conversation(world):
    return {"slug": world.slug, "conversation_id": world.conversation.public_id}


def _message(world):
    return {**_conversation(world), "message_id": world.message.public_id}


def _webhook(world):
    return {"slug": world.slug, "webhook_id": world.webhook.public_id}


def _delivery(world):
    return {**_webhook(world), "delivery_id": world.delivery.public_id}


def _api_base_model(world):
    return {"slug": world.slug, "model_id": world.base_model.public_id}


def _api_dataset(world):
    return {"slug": world.slug, "dataset_id": world.sft.dataset.public_id}


def _api_artifact(world):
    return {"slug": world.slug, "run_id": world.run.public_id, "kind": ArtifactKind.MODEL}


def _api_checkpoint(world):
    return {**_run(world), "step": 1}


def _chat_token(world):
    return {"slug": world.slug, "token_id": world.spare_project_token.pk}


def _api_token(world):
    return {"token_id": world.spare_api_token.pk}


def _runs_query(world):
    return f"?runs={world.run.public_id}"


def _chat_body(world):
    return {"model": world.base_model.public_id, "messages": [{"role": "user", "content": "hi"}], "stream": True}


def _completion_body(world):
    return {"model": world.base_model.public_id, "prompt": "hi", "stream": True}


VIEWER, MEMBER, OWNER = Role.VIEWER, Role.MEMBER, Role.OWNER
READ = {"GET": VIEWER}
READ_MEMBER_WRITE = {"GET": VIEWER, "POST": MEMBER}

def _body(response) -> bytes:
    """A response's bytes. A download's streaming body is asynchronous even from a sync view
    (``webapp.core.streaming``); iterating the response reads either kind."""
    return b"".join(response) if response.streaming else response.content


ROUTES: dict[str, Route] = {
    "projects:detail": Route(kwargs=_project, methods=READ),
    "projects:members": Route(kwargs=_project, methods={"GET": VIEWER, "POST": OWNER}),
    "projects:member_role": Route(kwargs=_project, methods={"POST": OWNER}),
    "projects:member_remove": Route(kwargs=_project, methods={"POST": OWNER}),
    "projects:settings": Route(kwargs=_project, methods={"GET": OWNER, "POST": OWNER}),  # POST refused: no name
    "projects:delete": Route(kwargs=_project, methods={"POST": OWNER}),  # refused: no slug typed, runs queued
    "projects:storage": Route(kwargs=_project, methods=READ),
    "projects:storage_prune": Route(kwargs=_project, methods={"POST": OWNER}),
    "projects:storage_prune_state": Route(kwargs=_project, methods=READ),

    # Owners only, reading too: a chat's incoming-webhook address is a secret itself, and so is the signing key.
    "webhooks:list": Route(kwargs=_project, methods={"GET": OWNER, "POST": OWNER}),
    "webhooks:edit": Route(kwargs=_webhook, methods={"GET": OWNER, "POST": OWNER}),
    "webhooks:delete": Route(kwargs=_webhook, methods={"POST": OWNER}),
    "webhooks:secret": Route(kwargs=_webhook, methods={"POST": OWNER}),
    "webhooks:test": Route(kwargs=_webhook, methods={"POST": OWNER}),  # sent to a closed port: refused, at once
    "webhooks:redeliver": Route(kwargs=_delivery, methods={"POST": OWNER}),
    "activity:list": Route(kwargs=_project, methods=READ),

    "basemodels:list": Route(kwargs=_project, methods=READ),
    "basemodels:register": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "basemodels:upload": Route(kwargs=_project, methods={"GET": OWNER, "POST": OWNER}),  # writes under the models root
    "basemodels:detail": Route(kwargs=_base_model, methods=READ),
    "basemodels:delete": Route(kwargs=_base_model, methods={"POST": MEMBER}),  # the world's is the teammate's
    "basemodels:serving_copy": Route(kwargs=_base_model, methods=READ_MEMBER_WRITE),

    "datasets:list": Route(kwargs=_project, methods=READ),
    "datasets:upload": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "datasets:detail": Route(kwargs=_dataset, methods=READ),
    "datasets:version_upload": Route(kwargs=_dataset, methods={"GET": MEMBER, "POST": MEMBER}),
    # a member deletes what they uploaded (the world's versions are the teammate's), an owner anything
    "datasets:delete": Route(kwargs=_dataset, methods={"POST": MEMBER}),
    "datasets:about": Route(kwargs=_dataset, methods={"POST": MEMBER}),
    "datasets:compare": Route(kwargs=_dataset, methods=READ),
    "datasets:version": Route(kwargs=_version, methods=READ),
    "datasets:download": Route(kwargs=_version, methods=READ),
    "datasets:requeue": Route(kwargs=_version, methods={"POST": MEMBER}),
    "datasets:split": Route(kwargs=_version, methods={"POST": MEMBER}),
    "datasets:dedupe": Route(kwargs=_version, methods={"POST": MEMBER}),
    "datasets:decontaminate": Route(kwargs=_version, methods={"POST": MEMBER}),
    "datasets:tokens": Route(kwargs=_version, methods={"POST": MEMBER}),
    "datasets:version_delete": Route(kwargs=_version, methods={"POST": MEMBER}),

    "runs:list": Route(kwargs=_project, methods=READ),
    "runs:new": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "runs:check": Route(kwargs=_project, methods={"POST": MEMBER}),
    "runs:archive": Route(kwargs=_project, methods={"POST": MEMBER}),
    # POST only turns the ticked runs into the compare page's address: a read.
    "runs:compare": Route(kwargs=_project, query=_runs_query, methods={"GET": VIEWER, "POST": VIEWER}),
    "runs:compare_csv": Route(kwargs=_project, query=_runs_query, methods=READ),
    "runs:pipeline_new": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "runs:pipeline": Route(kwargs=_pipeline, methods=READ),
    "runs:pipeline_cancel": Route(kwargs=_pipeline, methods={"POST": MEMBER}),
    "runs:detail": Route(kwargs=_run, methods=READ),
    "runs:state": Route(kwargs=_run, methods=READ),
    "runs:events": Route(kwargs=_run, methods=READ),
    "runs:samples": Route(kwargs=_run, methods=READ),
    "runs:checkpoints": Route(kwargs=_run, methods=READ),
    "runs:serving_copy": Route(kwargs=_run, methods=READ_MEMBER_WRITE),
    "runs:artifact": Route(kwargs=_api_artifact, methods=READ),
    "runs:artifact_card": Route(kwargs=_api_artifact, methods=READ),
    "runs:cancel": Route(kwargs=_run, methods={"POST": MEMBER}),
    "runs:resume": Route(kwargs=_run, methods={"POST": MEMBER}),
    "runs:retry": Route(kwargs=_run, methods={"POST": MEMBER}),
    "runs:delete": Route(kwargs=_run, methods={"POST": MEMBER}),  # the world's run is the teammate's
    "runs:edit": Route(kwargs=_run, methods={"POST": MEMBER}),
    "runs:export_checkpoint": Route(kwargs=_run, methods={"POST": MEMBER}),
    "runs:checkpoint_serving_copy": Route(kwargs=_run, methods={"POST": MEMBER}),
    "runs:checkpoint_delete": Route(kwargs=_run, methods={"POST": MEMBER}),  # who may delete the (teammate's) run
    "runs:checkpoints_prune": Route(kwargs=_run, methods={"POST": MEMBER}),  # who may delete the (teammate's) run

    "review:list": Route(kwargs=_project, methods=READ),
    "review:create": Route(kwargs=_project, methods={"GET": OWNER, "POST": OWNER}),
    "review:generate": Route(kwargs=_project, methods={"GET": OWNER, "POST": OWNER}),
    "review:detail": Route(kwargs=_campaign, methods=READ),
    "review:settings": Route(kwargs=_campaign, methods={"GET": OWNER, "POST": OWNER}),
    "review:delete": Route(kwargs=_campaign, methods={"POST": OWNER}),
    "review:load": Route(kwargs=_campaign, methods={"POST": OWNER}),
    "review:cancel": Route(kwargs=_campaign, methods={"POST": OWNER}),
    "review:next": Route(kwargs=_campaign, methods={"GET": MEMBER, "POST": MEMBER}),
    "review:change": Route(kwargs=_campaign, methods={"POST": MEMBER}),
    "review:items": Route(kwargs=_campaign, methods=READ),
    "review:conflicts": Route(kwargs=_campaign, methods={"GET": OWNER}),
    "review:resolve": Route(kwargs=_item, methods={"GET": OWNER, "POST": OWNER}),
    "review:export": Route(kwargs=_campaign, methods={"POST": OWNER}),

    # Evaluating spends the serve worker's time: the member role, as the chat.
    "evals:list": Route(kwargs=_project, methods=READ),
    "evals:create": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "evals:detail": Route(kwargs=_evaluation, methods=READ),
    "evals:cancel": Route(kwargs=_evaluation, methods={"POST": MEMBER}),
    "evals:delete": Route(kwargs=_evaluation, methods={"POST": MEMBER}),  # refused: it is queued

    # Chatting spends accelerator time: the member role. Conversations and battles are their author's.
    "chat:list": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "chat:token_create": Route(kwargs=_project, methods={"POST": MEMBER}),
    "chat:token_revoke": Route(kwargs=_chat_token, methods={"POST": MEMBER}, private=True),
    "chat:arena": Route(kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "chat:leaderboard": Route(kwargs=_project, methods=READ),
    "chat:arena_export": Route(kwargs=_project, methods={"POST": MEMBER}),
    "chat:arena_to_review": Route(kwargs=_project, methods={"POST": OWNER}),
    "chat:arena_review_create": Route(kwargs=_project, methods={"POST": OWNER}),
    "chat:battle": Route(kwargs=_battle, methods={"GET": MEMBER}, private=True),
    "chat:vote": Route(kwargs=_battle, methods={"POST": MEMBER}, private=True),
    "chat:detail": Route(kwargs=_conversation, methods={"GET": MEMBER}, private=True),
    "chat:delete": Route(kwargs=_conversation, methods={"POST": MEMBER}, private=True),  # refused: an answer streams
    "chat:send": Route(kwargs=_conversation, methods={"POST": MEMBER}, private=True),
    "chat:regenerate": Route(kwargs=_conversation, methods={"POST": MEMBER}, private=True),
    "chat:message": Route(kwargs=_message, methods={"GET": MEMBER}, private=True),
    "chat:stop": Route(kwargs=_message, methods={"POST": MEMBER}, private=True),
    "chat:events": Route(kwargs=_message, methods={"GET": MEMBER}, private=True),
    "chat:v1_models": Route(auth=Auth.PROJECT_TOKEN, methods={"GET": MEMBER}),
    "chat:v1_model": Route(auth=Auth.PROJECT_TOKEN, kwargs=lambda world: {"model_id": world.base_model.public_id},
                           methods={"GET": MEMBER}),
    "chat:v1_chat_completions": Route(auth=Auth.PROJECT_TOKEN, body=_chat_body, methods={"POST": MEMBER},
                                      queues_a_generation=True),
    "chat:v1_completions": Route(auth=Auth.PROJECT_TOKEN, body=_completion_body, methods={"POST": MEMBER},
                                 queues_a_generation=True),

    "api:project": Route(auth=Auth.API_TOKEN, kwargs=_project, methods={"GET": VIEWER, "PATCH": OWNER}),
    "api:storage": Route(auth=Auth.API_TOKEN, kwargs=_project, methods=READ),
    "api:storage_prune": Route(auth=Auth.API_TOKEN, kwargs=_project, methods={"GET": VIEWER, "POST": OWNER}),
    # Owners only, reading too, as the Webhooks page.
    "api:webhooks": Route(auth=Auth.API_TOKEN, kwargs=_project, methods={"GET": OWNER, "POST": OWNER}),
    "api:webhook": Route(auth=Auth.API_TOKEN, kwargs=_webhook, methods={"GET": OWNER, "PATCH": OWNER, "DELETE": OWNER}),
    "api:webhook_secret": Route(auth=Auth.API_TOKEN, kwargs=_webhook, methods={"POST": OWNER}),
    "api:webhook_test": Route(auth=Auth.API_TOKEN, kwargs=_webhook, methods={"POST": OWNER}),
    "api:webhook_deliveries": Route(auth=Auth.API_TOKEN, kwargs=_webhook, methods={"GET": OWNER}),
    "api:webhook_redeliver": Route(auth=Auth.API_TOKEN, kwargs=_delivery, methods={"POST": OWNER}),
    "api:activity": Route(auth=Auth.API_TOKEN, kwargs=_project, methods=READ),
    "api:base_models": Route(auth=Auth.API_TOKEN, kwargs=_project, methods={"GET": VIEWER, "POST": OWNER}),
    "api:base_model": Route(auth=Auth.API_TOKEN, kwargs=_api_base_model, methods={"GET": VIEWER, "DELETE": MEMBER}),
    "api:datasets": Route(auth=Auth.API_TOKEN, kwargs=_project, methods=READ_MEMBER_WRITE),
    "api:dataset": Route(auth=Auth.API_TOKEN, kwargs=_api_dataset, methods={"GET": VIEWER, "PATCH": MEMBER,
                                                                             "DELETE": MEMBER}),
    "api:dataset_compare": Route(auth=Auth.API_TOKEN, kwargs=_api_dataset, methods=READ),
    "api:dataset_version": Route(auth=Auth.API_TOKEN, kwargs=lambda world: {**_api_dataset(world),
                                                                            "number": world.sft.number},
                                 methods={"GET": VIEWER, "DELETE": MEMBER}),
    "api:dataset_version_split": Route(auth=Auth.API_TOKEN, kwargs=lambda world: {**_api_dataset(world),
                                                                                  "number": world.sft.number},
                                       methods={"POST": MEMBER}),
    "api:dataset_version_derive": Route(auth=Auth.API_TOKEN, kwargs=lambda world: {**_api_dataset(world),
                                                                                   "number": world.sft.number},
                                        methods={"POST": MEMBER}),
    "api:dataset_version_file": Route(auth=Auth.API_TOKEN, kwargs=lambda world: {**_api_dataset(world),
                                                                                 "number": world.sft.number},
                                      methods=READ),
    "api:dataset_version_by_id": Route(auth=Auth.API_TOKEN, kwargs=lambda world: {
        "slug": world.slug, "version_id": world.sft.public_id}, methods=READ),
    "api:runs": Route(auth=Auth.API_TOKEN, kwargs=_project, methods=READ_MEMBER_WRITE),
    "api:run": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"GET": VIEWER, "PATCH": MEMBER, "DELETE": MEMBER}),
    "api:run_cancel": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"POST": MEMBER}),
    "api:run_resume": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"POST": MEMBER}),
    "api:run_retry": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"POST": MEMBER}),
    "api:run_duplicate": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"POST": MEMBER}),
    "api:run_finish": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"POST": MEMBER}),
    "api:run_metrics": Route(auth=Auth.API_TOKEN, kwargs=_run, methods=READ_MEMBER_WRITE),
    "api:run_samples": Route(auth=Auth.API_TOKEN, kwargs=_run, methods=READ_MEMBER_WRITE),
    "api:run_logs": Route(auth=Auth.API_TOKEN, kwargs=_run, methods=READ),
    "api:run_artifact": Route(auth=Auth.API_TOKEN, kwargs=_api_artifact, methods=READ),
    "api:run_artifact_card": Route(auth=Auth.API_TOKEN, kwargs=_api_artifact, methods=READ),
    "api:run_checkpoints": Route(auth=Auth.API_TOKEN, kwargs=_run, methods=READ),
    "api:run_checkpoint": Route(auth=Auth.API_TOKEN, kwargs=_api_checkpoint, methods={"DELETE": MEMBER}),
    "api:run_checkpoint_export": Route(auth=Auth.API_TOKEN, kwargs=_api_checkpoint, methods={"POST": MEMBER}),
    "api:run_checkpoint_serving_copy": Route(auth=Auth.API_TOKEN, kwargs=_api_checkpoint, methods={"POST": MEMBER}),
    "api:run_checkpoints_prune": Route(auth=Auth.API_TOKEN, kwargs=_run, methods={"POST": MEMBER}),
    "api:pipelines": Route(auth=Auth.API_TOKEN, kwargs=_project, methods=READ_MEMBER_WRITE),
    "api:pipeline": Route(auth=Auth.API_TOKEN, kwargs=_pipeline, methods=READ),
    "api:pipeline_cancel": Route(auth=Auth.API_TOKEN, kwargs=_pipeline, methods={"POST": MEMBER}),
    "api:evaluations": Route(auth=Auth.API_TOKEN, kwargs=_project, methods=READ_MEMBER_WRITE),
    "api:evaluation": Route(auth=Auth.API_TOKEN, kwargs=_api_evaluation, methods={"GET": VIEWER, "DELETE": MEMBER}),
    "api:evaluation_cancel": Route(auth=Auth.API_TOKEN, kwargs=_api_evaluation, methods={"POST": MEMBER}),
    # The /v1/ tokens of the Chat page, by a REST token: the member role, each the teammate's own.
    "api:chat_tokens": Route(auth=Auth.API_TOKEN, kwargs=_project, methods={"GET": MEMBER, "POST": MEMBER}),
    "api:chat_token": Route(auth=Auth.API_TOKEN, kwargs=_chat_token, methods={"DELETE": MEMBER}, private=True),
    # A user's own REST token: not a project's, so any signed-in user may call it, on their tokens only.
    "api:token_revoke": Route(kwargs=_api_token, methods={"POST": VIEWER}, private=True),
}

EXEMPT: dict[str, str] = {
    "healthz": "liveness probe: no data, no login by design",
    "metrics": "Prometheus text: its own check (TEMPER_METRICS_TOKEN or an address in TEMPER_METRICS_ALLOW), tested in core/test_metrics.py",
    "accounts:login": "the login page itself",
    "accounts:logout": "ends the caller's own session",
    "accounts:password_change": "the caller's own password (login required, accounts/test_views.py)",
    "accounts:password_change_done": "a static confirmation for the caller",
    "accounts:review_shortcuts": "the caller's own preference (login required, accounts/test_views.py)",
    "admin_password_change": "a redirect to accounts:password_change, the throttled form (accounts/test_views.py)",
    "projects:list": "lists only the caller's own projects",
    "projects:create": "anyone signed in may create a project, or staff only (TEMPER_PROJECT_CREATORS=staff: projects/test_views.py)",
    "workers:list": "workers are shared infrastructure, shown to every signed-in user (workers/test_workers.py)",
    "api:openapi": "describes the API, not any data: public by design",
    "api:tokens": "the caller's own REST tokens",
    "api:projects": "lists only the token's user's own projects (api/test_api.py)",
}
# The admin site: staff only, behind admin.site's own check; its patterns are Django's.
EXEMPT_NAMESPACES = {"admin": "Django's admin site, for staff only"}


def url_patterns(patterns=None, namespace: str = "", prefix: str = "") -> list[tuple[str, str, str]]:
    """(top namespace, qualified name, route) of every pattern under ``patterns`` (the root URLconf by default)."""
    found = []
    for pattern in get_resolver().url_patterns if patterns is None else patterns:
        if isinstance(pattern, URLResolver):
            inner = ":".join(part for part in (namespace, pattern.namespace or "") if part)
            found += url_patterns(pattern.url_patterns, inner, prefix + str(pattern.pattern))
        else:
            assert isinstance(pattern, URLPattern)
            name = f"{namespace}:{pattern.name}" if namespace and pattern.name else pattern.name or ""
            found.append((namespace.split(":")[0], name, prefix + str(pattern.pattern)))
    return found


def test_the_table_covers_every_url_pattern():
    patterns = [(name, route) for top, name, route in url_patterns() if top not in EXEMPT_NAMESPACES]
    names = [name for name, _route in patterns]
    assert all(names), f"every URL pattern needs a name to be swept: {[route for name, route in patterns if not name]}"
    shared = sorted({name for name in names if names.count(name) > 1})
    assert not shared, f"two URL patterns share a name: {shared}"
    unknown = sorted(set(names) - ROUTES.keys() - EXEMPT.keys())
    assert not unknown, (f"URL patterns the access sweep does not know: {unknown}. Add each to ROUTES (how to fill "
                         "its arguments and the least role per method) or, if it reaches no project and no object, "
                         "to EXEMPT with the reason.")
    assert not (ROUTES.keys() | EXEMPT.keys()) - set(names), "ROUTES or EXEMPT name patterns that are gone"
    assert not ROUTES.keys() & EXEMPT.keys()
    exempt_with_arguments = [name for name, route in patterns if name in EXEMPT and "<" in route]
    assert not exempt_with_arguments, f"patterns that take a project or an id cannot be exempt: {exempt_with_arguments}"


# The world -------------------------------------------------------------------------------------------


@pytest.fixture
def queued(monkeypatch):
    """Tasks the views send to Celery directly (most are sent on commit, which the tests capture)."""
    calls = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args=None, queue=None, **options: calls.append(name))
    return calls


@pytest.fixture
def world(team, queued, settings) -> World:
    # Nothing here may reach a Redis another test (or person) uses: live streams end at once instead.
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    project, teammate = team.project, team.teammate
    base_model = make_base_model(project, name="tiny", path="/models/tiny", user=teammate)
    make_base_model(project, name="small", path="/models/small")  # a battle needs two models
    sft = make_ready_version(project, name="chats", kind="sft", user=teammate)
    preference = make_ready_version(project, name="pairs", kind="preference", user=teammate,
                                    rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": sft.public_id},
            "train": {"max_steps": 10, "batch_size": 2}}
    run = run_services.run_create(project=project, spec=spec, user=teammate, name="first")
    export = Path(settings.DATA_ROOT) / "exports" / run.public_id
    export.mkdir(parents=True)
    (export / "config.json").write_text("{}")
    (export / "README.md").write_text("# the model card\n")
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=str(export), size_bytes=2)
    (run.output_dir / "checkpoints" / "1").mkdir(parents=True)  # a deletion of it is refused: the run is queued
    pipeline = pipelines.pipeline_create(project=project, user=teammate,
                                         document={"name": "chain", "stages": [{"name": "sft", "spec": spec}]})
    campaign = review_services.campaign_create(project=project, name="pass 1", guidelines="", required_reviews=1,
                                               reviewers=[teammate], source_version=preference, user=team.owner)
    campaign = review_services.campaign_load_items(campaign_id=campaign.pk)
    evaluation = evaluation_services.evaluation_create(
        project=project, model_ref=base_model.public_id, version=sft,
        settings=evaluation_services.EvaluationSettings(), user=teammate)
    choices = chat_selectors.model_choices(project=project)
    conversation = chat_services.conversation_create(project=project, user=teammate, model=choices[0])
    message = chat_services.message_send(conversation=conversation, model=choices[0], content=PRIVATE_TEXT)
    chat_services.message_finish(message_id=message.public_id, text="hello", finish_reason="stop")
    battle = arena.battle_create(project=project, user=teammate, prompt="Name a colour.", choices=choices)
    for side in (battle.side_a, battle.side_b):
        chat_services.message_finish(message_id=arena.battle_answer(side).public_id, text="red", finish_reason="stop")

    with override_settings(TEMPER_WEBHOOK_ALLOWED_NETWORKS=(ip_network("127.0.0.0/8"),)):  # a hook on this host
        webhook = webhook_services.webhook_create(project=project, url="http://127.0.0.1:9/hook",
                                                  events=["run.failed"], format="json", user=team.owner)
    delivery = WebhookDelivery.objects.create(webhook=webhook, event="run.failed", payload=webhook_payload(
        event="run.failed", project_slug=project.slug, subject=run_subject(run), occurred_at=run.created_at))

    secrets = {(Auth.API_TOKEN, role): token_create(user=getattr(team, role), name="sweep")[1]
               for role in ("owner", "teammate", "viewer", "outsider")}
    for role in ("owner", "teammate"):
        secrets[Auth.PROJECT_TOKEN, role] = project_token_create(user=getattr(team, role), project=project, name="x")[1]
    secrets[Auth.PROJECT_TOKEN, "outsider"] = project_token_create(user=team.outsider, project=team.outsider_project,
                                                                   name="theirs")[1]
    # The viewer's token was made while they were a member; it stopped working when they became a viewer.
    Membership.objects.filter(project=project, user=team.viewer).update(role=MEMBER)
    secrets[Auth.PROJECT_TOKEN, "viewer"] = project_token_create(user=team.viewer, project=project, name="old")[1]
    Membership.objects.filter(project=project, user=team.viewer).update(role=VIEWER)
    return World(team=team, base_model=base_model, sft=sft, run=run, pipeline=pipeline, campaign=campaign,
                 item=campaign.items.first(), evaluation=evaluation, conversation=conversation, message=message, battle=battle,
                 webhook=webhook, delivery=delivery,
                 spare_project_token=project_token_create(user=teammate, project=project, name="spare")[0],
                 spare_api_token=token_create(user=teammate, name="spare")[0], secrets=secrets)


# Requests --------------------------------------------------------------------------------------------


@dataclass
class Answer:
    status: int
    location: str
    body: str


@dataclass
class Caller:
    """One user (or nobody) calling every kind of URL: a logged-in client for the pages, their
    tokens for the APIs."""

    world: World
    role: str | None  # a ``Team`` attribute, or None for anonymous
    enforce_csrf_checks: bool = False  # as a browser's request is checked (the test client skips the check)
    clients: dict[bool, Client | AsyncClient] = field(init=False)  # by whether the view is async

    def __post_init__(self):
        self.clients = {False: Client(enforce_csrf_checks=self.enforce_csrf_checks),
                        True: AsyncClient(enforce_csrf_checks=self.enforce_csrf_checks)}
        if self.role is not None:
            for client in self.clients.values():
                client.force_login(getattr(self.world.team, self.role))

    def call(self, method: str, name: str, route: Route, kwargs: dict, body: dict | None) -> Answer:
        path = reverse(name, kwargs=kwargs) + route.query(self.world)
        headers = {}
        if route.auth is not Auth.SESSION:
            secret = self.world.secrets.get((route.auth, self.role))
            if secret:
                headers["Authorization"] = f"Bearer {secret}"
        if route.auth is Auth.SESSION:
            data, content_type = b"", "application/x-www-form-urlencoded"
        else:
            data, content_type = json.dumps(body or {}).encode(), "application/json"
        is_async = iscoroutinefunction(resolve(path.split("?")[0]).func)
        client = self.clients[is_async]
        if not is_async:
            response = client.generic(method, path, data, content_type=content_type, headers=headers)
            content = _body(response)
        else:
            async def fetch():
                answer = await client.generic(method, path, data, content_type=content_type, headers=headers)
                if answer.streaming:
                    return answer, b"".join([chunk.encode() if isinstance(chunk, str) else chunk
                                             async for chunk in answer.streaming_content])
                return answer, answer.content
            response, content = async_to_sync(fetch)()
        return Answer(status=response.status_code, location=response.get("Location", ""),
                      body=content.decode(errors="replace"))


def ghost(value: Any) -> Any:
    """``value`` (URL arguments or a body) with every id and number swapped for one that names no row."""
    if isinstance(value, dict):
        return {key: ghost(item) for key, item in value.items()}
    if isinstance(value, list):
        return [ghost(item) for item in value]
    if isinstance(value, bool):
        return value
    if isinstance(value, int):
        return GHOST_NUMBER
    if isinstance(value, str) and re.fullmatch(r"[a-z]+_[A-Za-z0-9]+", value):
        return value.split("_")[0] + "_missing"
    return value


def ghost_kwargs(kwargs: dict, *, keep_slug: bool) -> dict:
    """URL arguments naming a missing object: of the same project (``keep_slug``) or of none."""
    ghosted = ghost({key: value for key, value in kwargs.items() if key != "slug"})
    if "slug" in kwargs:
        ghosted["slug"] = kwargs["slug"] if keep_slug else GHOST_SLUG
    return ghosted


def same_answer(real: Answer, missing: Answer, renamed: dict[str, str]) -> bool:
    """Two answers that tell nothing apart: the status, and for JSON the body too, once the names
    asked for (``renamed``: real → missing, which an error message may repeat) are swapped."""
    if real.status != missing.status:
        return False
    if real.body.startswith("{") and missing.body.startswith("{"):
        body = real.body
        for name, missing_name in renamed.items():
            # Whole names only: a short id (a token's 6) is also a digit of /api/v1/ or of a year in the message.
            body = re.sub(rf"(?<!\w){re.escape(name)}(?!\w)", lambda _: missing_name, body)
        return json.loads(body) == json.loads(missing.body)
    return True


def renamings(real: Any, missing: Any) -> dict[str, str]:
    """The strings of ``real`` (URL arguments, a body) and what ``missing`` has in their place."""
    if isinstance(real, dict):
        return {name: other for key in real for name, other in renamings(real[key], missing[key]).items()}
    if isinstance(real, list):
        return {name: other for one, two in zip(real, missing) for name, other in renamings(one, two).items()}
    return {str(real): str(missing)} if real != missing and not isinstance(real, bool) else {}


def database_state() -> dict[str, list]:
    """Every row of every model but sessions (a login writes one), and the files under DATA_ROOT."""
    state = {}
    for model in apps.get_models():
        if model._meta.app_label == "sessions":
            continue
        fields = [f.attname for f in model._meta.concrete_fields if f.attname not in VOLATILE_FIELDS]
        state[model._meta.label] = sorted(model.objects.values_list(*fields), key=repr)
    state["files"] = sorted(str(path) for path in Path(settings.DATA_ROOT).rglob("*"))
    return state


def sweep_unchanged(check: Callable[[], list[str]], queued: list, capture) -> list[str]:
    """Run ``check`` and add a problem if it changed a row or a file, or queued or would queue a task."""
    before, queued_before = database_state(), len(queued)
    with capture() as callbacks:
        problems = check()
    after = database_state()
    changed = [label for label in after if before.get(label) != after[label]]
    if changed:
        problems.append(f"the sweep changed {changed}")
    if queued[queued_before:] or callbacks:
        problems.append(f"the sweep queued work: {queued[queued_before:]}, {len(callbacks)} on-commit callback(s)")
    return problems


def who_may(role: str) -> str:
    return {VIEWER: "viewer", MEMBER: "teammate", OWNER: "owner"}[role]


def report(problems: list[str]) -> str:
    return f"{len(problems)} access problem(s):\n" + "\n".join(problems)


# The sweeps ------------------------------------------------------------------------------------------


def test_outsiders_get_404_and_anonymous_users_are_sent_to_log_in(world, queued,
                                                                    django_capture_on_commit_callbacks):
    outsider, anonymous = Caller(world, "outsider"), Caller(world, None)
    markers, named = world.markers(), world.named()

    def check() -> list[str]:
        problems = []
        for name, route in ROUTES.items():
            kwargs, body = route.kwargs(world), route.body(world) if route.body else None
            for method in METHODS:
                answer = outsider.call(method, name, route, kwargs, body)
                missing_kwargs, missing_body = ghost_kwargs(kwargs, keep_slug=False), ghost(body)
                missing = outsider.call(method, name, route, missing_kwargs, missing_body)
                renamed = renamings([kwargs, body], [missing_kwargs, missing_body])
                where = f"{method} {name} ({reverse(name, kwargs=kwargs)})"
                if method in route.methods and names_project(kwargs, body) and answer.status != 404:
                    problems.append(f"{where}: the outsider got {answer.status}, not 404")
                if not same_answer(answer, missing, renamed):
                    problems.append(f"{where}: the outsider got {answer.status} {answer.body[:120]!r}, for a missing "
                                    f"one {missing.status} {missing.body[:120]!r}")
                asked = reverse(name, kwargs=kwargs) + route.query(world) + json.dumps(body or {})
                leaked = sorted(marker for marker in markers if marker in answer.body and marker not in asked)
                if leaked:
                    problems.append(f"{where}: the outsider's answer shows {leaked}")
                shown = sorted(name for name in named
                               if answer.status == 404 and name in world.outsiders_own(answer.body))
                if shown:
                    problems.append(f"{where}: the outsider's 404 shows {shown}: {answer.body[:300]!r}")
            for method in route.methods:
                answer = anonymous.call(method, name, route, kwargs, body)
                where = f"{method} {name}"
                if route.auth is Auth.SESSION:
                    if answer.status != 302 or not answer.location.startswith(reverse("accounts:login") + "?next="):
                        problems.append(f"{where}: an anonymous user got {answer.status} {answer.location!r}, "
                                        "not sent to log in")
                elif answer.status != 401:
                    problems.append(f"{where}: a request without a token got {answer.status}, not 401")
        return problems

    problems = sweep_unchanged(check, queued, django_capture_on_commit_callbacks)
    assert not problems, report(problems)


def test_members_below_the_role_get_403_and_private_objects_stay_private(world, queued,
                                                                          django_capture_on_commit_callbacks):
    callers = {role: Caller(world, role) for role in ("viewer", "teammate", "owner")}
    rank = {"viewer": 0, "teammate": 1, "owner": 2}

    def check() -> list[str]:
        problems = []
        for name, route in ROUTES.items():
            kwargs, body = route.kwargs(world), route.body(world) if route.body else None
            for method, least in route.methods.items():
                for role, caller in callers.items():
                    where = f"{method} {name}: the {role}"
                    if rank[role] < rank[who_may(least)]:
                        answer = caller.call(method, name, route, kwargs, body)
                        # A project token of a member who became a viewer is refused as a page is, saying why.
                        if answer.status != 403:
                            problems.append(f"{where} got {answer.status}, not 403")
                    if route.private and role != "teammate":
                        answer = caller.call(method, name, route, kwargs, body)
                        missing_kwargs = ghost_kwargs(kwargs, keep_slug=True)
                        missing = caller.call(method, name, route, missing_kwargs, body)
                        hidden = same_answer(answer, missing, renamings(kwargs, missing_kwargs))
                        if not hidden or PRIVATE_TEXT in answer.body:
                            problems.append(f"{where} got {answer.status} for the teammate's own, for a missing one "
                                            f"{missing.status}")
        return problems

    problems = sweep_unchanged(check, queued, django_capture_on_commit_callbacks)
    assert not problems, report(problems)


# Forms of a signed-in browser that name no project (login too: a login forged into another account): they are not
# in ROUTES, but another site's page could send them all the same.
SESSION_WRITES_WITHOUT_A_PROJECT = (
    "accounts:login", "accounts:logout", "accounts:password_change", "projects:create", "api:tokens")


def test_every_write_a_session_may_send_needs_the_csrf_token(world, queued, django_capture_on_commit_callbacks):
    """A page of another site can make a signed-in member's browser send any form to Temper (the session cookie
    goes with it): every method but GET of a page is refused without the CSRF token, for the role that may use
    it, and changes nothing. The APIs take bearer tokens, which no other site's page can send."""
    callers = {role: Caller(world, role, enforce_csrf_checks=True) for role in ("viewer", "teammate", "owner")}

    def check() -> list[str]:
        problems = []
        for name, route in ROUTES.items():
            if route.auth is not Auth.SESSION:
                continue
            kwargs = route.kwargs(world)
            for method, least in route.methods.items():
                if method == "GET":
                    continue
                role = "teammate" if route.private else who_may(least)
                answer = callers[role].call(method, name, route, kwargs, None)
                if answer.status != 403 or "CSRF" not in answer.body:
                    problems.append(f"{method} {name}: the {role} without a CSRF token got {answer.status} "
                                    f"{answer.body[:120]!r}")
        for name in SESSION_WRITES_WITHOUT_A_PROJECT:
            answer = callers["owner"].call("POST", name, Route(methods={"POST": VIEWER}), {}, None)
            if answer.status != 403 or "CSRF" not in answer.body:
                problems.append(f"POST {name}: without a CSRF token got {answer.status} {answer.body[:120]!r}")
        return problems

    problems = sweep_unchanged(check, queued, django_capture_on_commit_callbacks)
    assert not problems, report(problems)


def test_the_least_role_reaches_every_url(world, django_capture_on_commit_callbacks):
    """The denials above are worth something only if the URLs name real objects: each method, called
    by the least role it takes (the author, for private objects), finds what it asks for. Each call
    is rolled back, so none changes what the next one finds."""
    callers = {role: Caller(world, role) for role in ("viewer", "teammate", "owner")}
    problems = []
    for name, route in ROUTES.items():
        kwargs, body = route.kwargs(world), route.body(world) if route.body else None
        for method, least in route.methods.items():
            role = "teammate" if route.private else who_may(least)
            with transaction.atomic(), django_capture_on_commit_callbacks():
                answer = callers[role].call(method, name, route, kwargs, body)
                transaction.set_rollback(True)
            if route.queues_a_generation and answer.status == 503 and "(Redis) is unavailable" in answer.body:
                continue
            if answer.status in (401, 403, 404, 405) or answer.status >= 500:
                problems.append(f"{method} {name}: the {role} got {answer.status} {answer.body[:160]!r}")
    assert not problems, report(problems)


# Objects named in a query or a body ---------------------------------------------------------------------
#
# A URL is not the only way to name an object: forms and API bodies take ids too (a run's model and
# data, a campaign's dataset version, the runs to compare or archive). The outsider, acting in their
# own project, names the team project's objects there: each is refused as a missing one would be,
# changing nothing; the same request with their own objects works, so the refusal is the reference's.


@dataclass(frozen=True, kw_only=True)
class Reference:
    """A request in the caller's own project that names objects by id: ``request(slug, ids)`` gives
    (query, form or JSON body) from ``ids`` (``project_ids``); ``kwargs(slug, ids)`` the URL's."""

    name: str
    method: str
    request: Callable[[str, dict[str, Any]], tuple[str, dict[str, Any]]]
    foreign: tuple[str, ...]  # the ids swapped, one at a time, for the team project's
    auth: Auth = Auth.SESSION
    kwargs: Callable[[str, dict[str, Any]], dict[str, Any]] = lambda slug, ids: {"slug": slug}


def _spec(ids):
    return {"task": "sft", "model": ids["model"], "data": {"train": ids["sft"]},
            "train": {"max_steps": 10, "batch_size": 2}}


def _pipeline_yaml(ids):
    return json.dumps({"name": "chain", "stages": [{"name": "sft", "spec": _spec(ids)}]})  # JSON is YAML


REFERENCES = [
    Reference(name="runs:new", method="GET", foreign=("run",), request=lambda slug, ids: (f"?from={ids['run']}", {})),
    Reference(name="runs:new", method="POST", foreign=("model", "sft"), request=lambda slug, ids: (
        "", {"mode": "yaml", "spec_yaml": json.dumps(_spec(ids))})),
    Reference(name="runs:compare_csv", method="GET", foreign=("run",),
              request=lambda slug, ids: (f"?runs={ids['run']}", {})),
    Reference(name="runs:archive", method="POST", foreign=("run",),
              request=lambda slug, ids: ("", {"runs": ids["run"]})),
    Reference(name="runs:pipeline_new", method="POST", foreign=("model", "sft"),
              request=lambda slug, ids: ("", {"document": _pipeline_yaml(ids)})),
    Reference(name="review:create", method="POST", foreign=("preference_pk", "user_pk"), request=lambda slug, ids: (
        "", {"name": "pass", "source_version": ids["preference_pk"], "required_reviews": 1,
             "reviewers": ids["user_pk"]})),
    Reference(name="review:settings", method="POST", foreign=("user_pk",), request=lambda slug, ids: (
        "", {"guidelines": "", "required_reviews": 1, "reviewers": ids["user_pk"]}),
        kwargs=lambda slug, ids: {"slug": slug, "public_id": ids["campaign"]}),
    Reference(name="datasets:tokens", method="POST", foreign=("model",), request=lambda slug, ids: (
        "", {"base_model": ids["model"]}),
        kwargs=lambda slug, ids: {"slug": slug, "public_id": ids["own_dataset"], "number": 1}),
    Reference(name="chat:list", method="POST", foreign=("model",), request=lambda slug, ids: (
        "", {"model": ids["model"], "temperature": 0.5, "top_p": 1, "top_k": 0, "max_tokens": 16})),
    Reference(name="chat:arena", method="POST", foreign=("model", "other_model"), request=lambda slug, ids: (
        "", {"prompt": "Name a colour.", "model_a": ids["model"], "model_b": ids["other_model"]})),
    Reference(name="chat:arena_to_review", method="POST", foreign=("campaign",), request=lambda slug, ids: (
        "", {"campaign": ids["campaign"], "scope": "all"})),
    Reference(name="runs:compare", method="GET", foreign=("run",),
              request=lambda slug, ids: (f"?runs={ids['run']}&runs={ids['other_run']}", {})),
    Reference(name="chat:list", method="GET", foreign=("model",), request=lambda slug, ids: (f"?model={ids['model']}", {})),
    Reference(name="basemodels:serving_copy", method="POST", foreign=("sft",), request=lambda slug, ids: (
        "", {"scheme": "int8", "eval_version": ids["sft"]}),
        kwargs=lambda slug, ids: {"slug": slug, "public_id": ids["model"]}),
    Reference(name="api:runs", method="POST", auth=Auth.API_TOKEN, foreign=("model", "sft"),
              request=lambda slug, ids: ("", {"spec": _spec(ids)})),
    Reference(name="api:pipelines", method="POST", auth=Auth.API_TOKEN, foreign=("model", "sft"),
              request=lambda slug, ids: ("", json.loads(_pipeline_yaml(ids)))),
]


def project_ids(project, user) -> dict[str, Any]:
    """One of each object a request may name, made in ``project`` by ``user`` (its owner)."""
    models = [make_base_model(project, name=name, path=f"/models/{project.slug}-{name}") for name in ("m1", "m2")]
    sft = make_ready_version(project, name="chats", kind="sft", user=user)
    preference = make_ready_version(project, name="pairs", kind="preference", user=user,
                                    rows=[{"prompt": "p", "chosen": "a", "rejected": "b"}])
    ids = {"model": models[0].public_id, "other_model": models[1].public_id, "sft": sft.public_id,
           "preference_pk": preference.pk, "user_pk": user.pk, "own_dataset": sft.dataset.public_id}
    ids["run"] = run_services.run_create(project=project, spec=_spec(ids), user=user, name="own").public_id
    ids["other_run"] = run_services.run_create(project=project, spec=_spec(ids), user=user, name="other").public_id
    ids["campaign"] = review_services.campaign_create(
        project=project, name="votes", guidelines="", required_reviews=1, reviewers=[user], source_version=None,
        user=user).public_id
    return ids


def test_an_outsider_cannot_name_the_projects_objects_in_a_query_or_a_body(world, queued,
                                                                           django_capture_on_commit_callbacks):
    team = world.team
    # The team project's objects, named from the outsider's own project, where they are an owner.
    theirs = project_ids(team.project, team.owner)
    own = project_ids(team.outsider_project, team.outsider)
    client = Client()
    client.force_login(team.outsider)
    token = world.secrets[Auth.API_TOKEN, "outsider"]

    def send(reference: Reference, ids: dict[str, Any]) -> Answer:
        query, data = reference.request(team.outsider_project.slug, ids)
        path = reverse(reference.name, kwargs=reference.kwargs(team.outsider_project.slug, ids)) + query
        if reference.auth is Auth.API_TOKEN:
            response = client.generic(reference.method, path, json.dumps(data), content_type="application/json",
                                      headers={"Authorization": f"Bearer {token}"})
        elif reference.method == "GET":
            response = client.get(path)
        else:
            response = client.post(path, data)
        content = _body(response)
        return Answer(status=response.status_code, location=response.get("Location", ""),
                      body=content.decode(errors="replace"))

    markers = world.markers() | {value for value in theirs.values() if isinstance(value, str)}
    problems = []
    for reference in REFERENCES:
        where = f"{reference.method} {reference.name}"
        for key in reference.foreign:
            named = {**own, key: theirs[key]}

            def refused() -> list[str]:
                answer = send(reference, named)
                missing = send(reference, {**own, key: ghost(theirs[key])})
                found = []
                if not same_answer(answer, missing, {str(theirs[key]): str(ghost(theirs[key]))}):
                    found.append(f"{where} naming their {key}: {answer.status} {answer.body[:160]!r}, for a missing "
                                 f"one {missing.status} {missing.body[:160]!r}")
                leaked = sorted(marker for marker in markers if marker in answer.body and marker != theirs[key])
                if leaked:
                    found.append(f"{where} naming their {key}: the answer shows {leaked}")
                return found

            problems += sweep_unchanged(refused, queued, django_capture_on_commit_callbacks)
        with transaction.atomic(), django_capture_on_commit_callbacks():
            answer = send(reference, own)
            transaction.set_rollback(True)
        if answer.status != (200 if reference.method == "GET" else 201 if reference.auth is Auth.API_TOKEN else 302):
            problems.append(f"{where} with the outsider's own objects: {answer.status} {answer.body[:160]!r}")
    assert not problems, report(problems)


def test_an_answer_naming_the_missing_object_in_place_of_a_short_id_is_the_same_answer():
    """The sweep swaps the names asked for in an error message: a short id (a project token's 6) is swapped where it
    stands as a name, not where it is a digit of ``/api/v1/`` or of a year (a full run, whose ids had grown, failed
    ``DELETE api:chat_token`` on the message's address)."""
    real = Answer(403, "", '{"detail": "token 6 of 2026: see /api/v1/projects/x/chat-tokens/"}')
    missing = Answer(403, "", '{"detail": "token 999999 of 2026: see /api/v1/projects/x/chat-tokens/"}')
    assert same_answer(real, missing, {"6": "999999"})
    assert same_answer(Answer(403, "", '{"detail": "v1"}'), Answer(403, "", '{"detail": "v1"}'), {"1": "999999"})
    assert not same_answer(real, Answer(403, "", '{"detail": "token 6 of 2026"}'), {"6": "999999"})
