"""Fixtures for web tests: the team (see ``tests/webapp/factories.py``) and a
``client_for(user)`` that returns a logged-in Django test client."""
from __future__ import annotations

import pytest
from django.test import Client

from tests.webapp.factories import Team, make_team


@pytest.fixture
def team(db) -> Team:
    return make_team()


@pytest.fixture
def client_for(db):
    def build(user) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return build
