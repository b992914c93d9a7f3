"""Every service that names a thing people pick by name refuses invisible format characters in it."""
import pytest
from django.core.exceptions import ValidationError

from webapp.basemodels import services as basemodel_services
from webapp.datasets import services as dataset_services
from webapp.projects import services as project_services
from webapp.review import services as review_services
from webapp.runs import services as run_services

HIDDEN = "qa3\u2060sft"  # U+2060 WORD JOINER at position 4


@pytest.mark.parametrize("make", [
    lambda team: dataset_services.dataset_create(project=team.project, name=HIDDEN, kind="sft", user=team.owner),
    lambda team: basemodel_services.basemodel_register(project=team.project, name=HIDDEN, path="tiny", user=team.owner),
    lambda team: run_services.run_create_external(project=team.project, name=HIDDEN, config={}, user=team.owner),
    lambda team: project_services.project_create(name=HIDDEN, slug="hidden", owner=team.owner),
    lambda team: review_services.campaign_create(project=team.project, name=HIDDEN, guidelines="", required_reviews=1,
                                                 reviewers=[team.owner], source_version=None, user=team.owner),
], ids=["dataset", "base model", "run", "project", "campaign"])
def test_it_rejects_a_name_with_an_invisible_character(team, make):
    with pytest.raises(ValidationError) as refused:
        make(team)
    assert refused.value.message_dict["name"][0].startswith("an invisible character, U+2060 (WORD JOINER), at position 4")


def test_a_run_cannot_be_renamed_to_one(team):
    run = run_services.run_create_external(project=team.project, name="laptop", config={}, user=team.owner)
    with pytest.raises(ValidationError, match="U\\+200B"):
        run_services.run_update_details(run=run, name="lap\u200btop")
