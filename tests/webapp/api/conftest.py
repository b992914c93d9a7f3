"""The API tests' world: the team of ``make_team`` on the live test server, a token and a client for each role
(``anonymous``: none), and the Celery tasks the requests sent, kept instead of sent."""
from __future__ import annotations

import pytest

from tests.webapp.api.client import Api
from tests.webapp.factories import make_team
from webapp.api.services import token_create


@pytest.fixture
def world(live_server, transactional_db, monkeypatch):
    sent = []
    monkeypatch.setattr("webapp.celery.app.send_task", lambda name, args=None, queue=None, **kw: sent.append(args))
    team = make_team()
    tokens = {role: token_create(user=getattr(team, role), name="test")[1]
              for role in ("owner", "teammate", "viewer", "outsider")}
    apis = {role: Api(live_server.url, token) for role, token in tokens.items()}
    apis["anonymous"] = Api(live_server.url, None)
    return team, apis, sent
