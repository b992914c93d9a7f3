"""Review test data: a team with a second member (``carol``), a ready preference version and a
campaign on it reviewed by the teammate and carol, its items loaded as the worker would. Tasks are
recorded, not sent (``sent_tasks``)."""
from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.factories import make_ready_version, make_user
from webapp.celery import app as celery_app
from webapp.projects import services as project_services
from webapp.projects.models import Role
from webapp.review import services
from webapp.review.models import Choice, Item, Lease

PREFERENCE_ROWS = [
    {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
    {"prompt": "Capital of France?", "chosen": "Paris", "rejected": "Lyon"},
    {"prompt": [{"role": "user", "content": "Say hi"}],
     "chosen": [{"role": "assistant", "content": "Hi!"}], "rejected": [{"role": "assistant", "content": "No."}]},
    {"prompt": "Spell cat", "chosen": "c-a-t", "rejected": "k-a-t"},
]


@pytest.fixture(autouse=True)
def sent_tasks(monkeypatch):
    sent = []
    monkeypatch.setattr(celery_app, "send_task", lambda name, args, queue: sent.append((name, args, queue)))
    return sent


def create_loaded(**kwargs):
    """``services.campaign_create`` and then the worker's item loading."""
    campaign = services.campaign_create(**kwargs)
    return services.campaign_load_items(campaign_id=campaign.pk)


@pytest.fixture
def carol(team):
    user = make_user("carol")
    project_services.membership_add(project=team.project, user=user, role=Role.MEMBER)
    return user


@pytest.fixture
def preference_version(team):
    return make_ready_version(team.project, name="prefs", kind="preference", rows=PREFERENCE_ROWS, user=team.owner)


@pytest.fixture
def campaign(team, carol, preference_version):
    return create_loaded(project=team.project, name="pass 1", guidelines="Prefer **correct** answers.",
                                    required_reviews=2, reviewers=[team.teammate, carol],
                                    source_version=preference_version, user=team.owner)


def choice_for(item, user, label: str) -> str:
    """The button ``user`` presses on ``item`` to give ``label`` (a/b/tie/both_bad/skip) in item terms."""
    if label in ("a", "b"):
        shown_first = services.shown_first_for(item_public_id=item.public_id, user_id=user.pk)
        return Choice.FIRST if shown_first == label else Choice.SECOND
    return label


def answer(item, user, label: str, **kwargs):
    """Submit ``user``'s review of ``item`` with ``label`` in item terms."""
    return services.review_submit(item=item, user=user, choice=choice_for(item, user, label), **kwargs)


def in_conflict_with_a_second_owner(campaign, team, carol, *, username: str):
    """Item 2 of ``campaign`` in conflict (the teammate answered A, carol B), and a second owner of the project
    named ``username``: (the item, that owner)."""
    owner = make_user(username)
    project_services.membership_add(project=team.project, user=owner, role=Role.OWNER)
    item = Item.objects.get(campaign=campaign, sequence=2)
    answer(item, team.teammate, "a")
    answer(item, carol, "b")
    return item, owner


def expire_leases(item, user=None):
    """Let the leases on ``item`` (only ``user``'s, when given) run out, as ten minutes would."""
    leases = Lease.objects.filter(item=item)
    if user is not None:
        leases = leases.filter(reviewer=user)
    leases.update(until=timezone.now() - timedelta(seconds=1))
