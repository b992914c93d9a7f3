import pytest

from webapp.runs.channels import redis_client


@pytest.fixture
def redis_db(redis_server, settings):
    """The test Redis server's database, emptied, and the app pointed at it (events, stop flags, queues).
    Not named ``client``: that would shadow pytest-django's test client for every worker test."""
    settings.REDIS_URL = redis_server.url
    client = redis_client()
    client.flushdb()
    return client
