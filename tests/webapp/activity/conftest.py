"""Activity tests reuse the run tests' catalog (a base model and ready datasets) and captured Celery tasks, and the
review tests' loaded campaign; each test starts from an empty log (``make_team``'s members were added by no one)."""
import pytest

from tests.webapp.review.conftest import campaign, carol, preference_version  # noqa: F401
from tests.webapp.runs.conftest import catalog, sent_tasks  # noqa: F401
from webapp.activity.models import Activity


@pytest.fixture(autouse=True)
def empty_log(team):
    Activity.objects.all().delete()
