"""A launch and the deletion of its project at the same instant on PostgreSQL: both lock the project's row
first (``projects.services.project_lock``), so whichever comes first wins and the other is refused in words.
Before, the deletion locked the row and the launch did not: the launch locked its dataset version and waited
on the project's row to save its run, the deletion waited on that version to delete it, and PostgreSQL broke
the deadlock by failing one of them (a server error); where the launch got its run saved between the
deletion's check and its delete, the run went with the project while its task was queued. Likewise a chat turn
and the deletion of its model (``chat.services.chat_model_lock``), a review campaign's generation and the
deletion of one of its models (``chat.services.model_lock``), an arena battle and the deletion of its project,
a /v1 completion and the deletion of its model (``chat.services.api_generation_start``), and a review campaign
on a dataset version and the deletion of its project (``review.services.campaign_create``)."""
from __future__ import annotations

import pytest

from tests.postgres.test_postgres import RACE_PREAMBLE, run_django

pytestmark = pytest.mark.integration

LAUNCH_AND_PROJECT_DELETE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.projects.models import Project
from webapp.runs import services
from webapp.runs.models import Run

celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("owner", password="unused-password")


def race(first, slug):
    '''Launch a run in a new project while another thread deletes the project; ``first`` is "delete" (it
    holds its lock a moment after its check while the launch comes in) or "launch" (the launch holds its
    locks a moment while the deletion comes in). Returns (launch outcome, deletion outcome).'''
    project = project_services.project_create(name=slug, slug=slug, owner=owner)
    base_model = make_base_model(project)
    version = make_ready_version(project, name="prefs")
    spec = {"task": "sft", "model": base_model.public_id, "data": {"train": version.public_id},
            "train": {"max_steps": 2}}
    outcome = race_in_order(
        first, readers=(project_services, "project_readers"), lock=(services, "_lock_what_it_reads"),
        delete=lambda: outcome_of(lambda: project_services.project_delete(project=Project.objects.get(pk=project.pk),
                                                                          confirmation=slug)),
        act=("launch", lambda: outcome_of(lambda: services.run_create(project=project, spec=spec, user=owner),
                                          made=lambda run: run.public_id)))
    return outcome["launch"], outcome["delete"]


launched, deleted = race("delete", "deleted-first")
assert deleted == ("made", ""), deleted
assert launched[0] == "refused" and "was deleted as the run was being launched" in launched[1], launched
assert not Project.objects.filter(slug="deleted-first").exists() and not Run.objects.exists()

launched, deleted = race("launch", "launched-first")
assert launched[0] == "made", launched
assert deleted[0] == "refused" and f"({launched[1]}) is queued" in deleted[1], deleted
assert Run.objects.filter(public_id=launched[1], project__slug="launched-first").exists()
print("ok")
"""


def test_a_launch_and_the_deletion_of_its_project_at_once_end_in_one_refusal(database_url, tmp_path):
    assert run_django(LAUNCH_AND_PROJECT_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


CHAT_AND_MODEL_DELETE_SCRIPT = RACE_PREAMBLE + """
from webapp.chat import services as chat_services
from webapp.chat.models import Conversation, Message
from webapp.chat.selectors import ModelChoice
from webapp.runs import selectors as run_selectors, services
from webapp.runs.models import Run, RunStatus

celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("chat-owner", password="unused-password")
project = project_services.project_create(name="PG chat", slug="pg-chat", owner=owner)


def race(first):
    '''Send a chat turn to a run's model while another thread deletes the run; ``first`` is "delete" (it holds
    its lock a moment after its check) or "send" (the turn holds its locks a moment). Returns (turn outcome,
    deletion outcome, conversation).'''
    public_id = services.new_run_id()
    run = Run.objects.create(public_id=public_id, project=project, name=f"{first} first", task="sft", spec={},
                             resolved_spec={"output_dir": str(services.run_output_dir(public_id))},
                             status=RunStatus.SUCCEEDED)
    model = ModelChoice(ref=run.public_id, label=run.name, option_label=run.name, path="/models/unused")
    conversation = Conversation.objects.create(project=project, user=owner, model_ref=model.ref,
                                               model_label=model.label)
    outcome = race_in_order(
        first, readers=(run_selectors, "run_readers"), lock=(chat_services, "chat_model_lock"),
        delete=lambda: outcome_of(lambda: services.run_delete(run=Run.objects.get(pk=run.pk))),
        act=("send", lambda: outcome_of(lambda: chat_services.message_send(conversation=conversation, model=model,
                                                                           content="Hello"), chat_services.ChatError)))
    return outcome["send"], outcome["delete"], conversation


sent, deleted, conversation = race("delete")
assert deleted == ("made", ""), deleted
assert sent[0] == "refused" and "was deleted as the message was being sent" in sent[1], sent
assert not Message.objects.filter(conversation=conversation).exists()

sent, deleted, conversation = race("send")
assert sent == ("made", ""), sent
assert deleted[0] == "refused" and f"conversation {conversation.public_id} is being answered" in deleted[1], deleted
assert Run.objects.filter(name="send first").exists()
print("ok")
"""


def test_a_chat_turn_and_the_deletion_of_its_model_at_once_end_in_one_refusal(database_url, tmp_path):
    """Without the turn's lock of the model's row, a turn sent as the run was deleted was saved and queued, and the
    serve worker answered it from the weights it still held."""
    assert run_django(CHAT_AND_MODEL_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


CAMPAIGN_AND_MODEL_DELETE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model, make_ready_version
from webapp.basemodels import services as base_model_services
from webapp.basemodels.models import BaseModel
from webapp.review import services as review_services
from webapp.review.models import Campaign

celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("review-owner", password="unused-password")
project = project_services.project_create(name="PG review", slug="pg-review", owner=owner)
prompts = make_ready_version(project, name="chats", kind="sft", user=owner)


def race(first):
    '''Create a campaign on the answers of two base models while another thread unregisters the second;
    ``first`` is "delete" (it holds its lock a moment after its check) or "generate" (the campaign holds its
    locks of both models a moment). Returns (generation outcome, deletion outcome).'''
    falcon = make_base_model(project, name=f"falcon {first}", path=f"/models/falcon-{first}")
    heron = make_base_model(project, name=f"heron {first}", path=f"/models/heron-{first}")
    outcome = race_in_order(
        first, readers=(base_model_services, "base_model_readers"), lock=(review_services, "model_lock"),
        hold_after_lock=lambda **kwargs: kwargs["field"] == "model_b",  # both models locked
        delete=lambda: outcome_of(lambda: base_model_services.basemodel_unregister(
            base_model=BaseModel.objects.get(pk=heron.pk))),
        act=("generate", lambda: outcome_of(lambda: review_services.campaign_generate(
            project=project, name=f"{first} first", guidelines="", required_reviews=1, reviewers=[owner],
            model_a=falcon.public_id, model_b=heron.public_id, prompts_version=prompts, prompt_count=2,
            sampling=review_services.GenerationSettings(), user=owner))))
    return outcome["generate"], outcome["delete"]


generated, deleted = race("delete")
assert deleted == ("made", ""), deleted
assert generated == ("refused", "the model \\u2068Base model: heron delete\\u2069 was deleted as the campaign was being "
                                "created; choose another model"), generated
assert not Campaign.objects.filter(name="delete first").exists()

generated, deleted = race("generate")
assert generated == ("made", ""), generated
assert deleted == ("refused", "review campaign \\u2068generate first\\u2069 is generating answers with it; wait until "
                              "it is ready"), deleted
assert BaseModel.objects.filter(name="heron generate").exists()
print("ok")
"""


def test_a_campaigns_generation_and_the_deletion_of_its_model_at_once_end_in_one_refusal(database_url, tmp_path):
    """Without the campaign's lock of its models' rows, a campaign created as one of them was unregistered was saved
    generating and queued: the serve worker then generated from a model no longer in the project."""
    assert run_django(CAMPAIGN_AND_MODEL_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


BATTLE_AND_PROJECT_DELETE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_base_model
from webapp.chat import arena
from webapp.chat import services as chat_services
from webapp.chat.models import Battle
from webapp.chat.selectors import ModelChoice
from webapp.projects.models import Project

celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("arena-owner", password="unused-password")


def race(first, slug):
    '''Start an arena battle in a new project while another thread deletes the project; ``first`` is "delete"
    (it holds its lock a moment after its check) or "battle" (the battle holds its first locks a moment).
    Returns (battle outcome, deletion outcome).'''
    project = project_services.project_create(name=slug, slug=slug, owner=owner)
    choices = [ModelChoice(ref=model.public_id, label=model.name, option_label=model.name, path="/models/unused")
               for model in (make_base_model(project, name="falcon", path="/models/falcon"),
                             make_base_model(project, name="heron", path="/models/heron"))]
    outcome = race_in_order(
        first, readers=(project_services, "project_readers"), lock=(chat_services, "chat_model_lock"),
        delete=lambda: outcome_of(lambda: project_services.project_delete(project=Project.objects.get(pk=project.pk),
                                                                          confirmation=slug)),
        act=("battle", lambda: outcome_of(lambda: arena.battle_create(project=project, user=owner, prompt="Hello",
                                                                      choices=choices), chat_services.ChatError)))
    return outcome["battle"], outcome["delete"]


started, deleted = race("delete", "deleted-first")
assert deleted == ("made", ""), deleted
assert started == ("refused", "project \\u2068deleted-first\\u2069 was deleted as the battle was being started"), started
assert not Project.objects.filter(slug="deleted-first").exists()

started, deleted = race("battle", "battle-first")
assert started == ("made", ""), started
assert deleted == ("refused", "a chat or arena answer is still being written; wait for it to finish"), deleted
assert Battle.objects.filter(project__slug="battle-first").count() == 1
print("ok")
"""


def test_an_arena_battle_and_the_deletion_of_its_project_at_once_end_in_one_refusal(database_url, tmp_path):
    """The battle locks the project and both models before its first row, and its refusal says so; before, only each
    side's turn locked them, and a battle refused there read "as the message was being sent"."""
    assert run_django(BATTLE_AND_PROJECT_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


COMPLETION_AND_MODEL_DELETE_SCRIPT = RACE_PREAMBLE + """
from webapp.chat import services as chat_services
from webapp.chat.models import ApiGeneration
from webapp.chat.selectors import ModelChoice
from webapp.chat.tokens import project_token_create
from webapp.runs import selectors as run_selectors, services
from webapp.runs.models import Run, RunStatus

owner = get_user_model().objects.create_user("api-owner", password="unused-password")
project = project_services.project_create(name="PG api", slug="pg-api", owner=owner)
token, _secret = project_token_create(user=owner, project=project, name="ci")


def race(first):
    '''Record a /v1 completion of a run's model (what the view does before queuing it) while another thread deletes
    the run; ``first`` is "delete" (it holds its lock a moment after its check) or "ask" (the completion holds its
    locks a moment). Returns (completion outcome, deletion outcome).'''
    public_id = services.new_run_id()
    run = Run.objects.create(public_id=public_id, project=project, name=f"{first} first", task="sft", spec={},
                             resolved_spec={"output_dir": str(services.run_output_dir(public_id))},
                             status=RunStatus.SUCCEEDED)
    model = ModelChoice(ref=run.public_id, label=run.name, option_label=run.name, path="/models/unused")
    outcome = race_in_order(
        first, readers=(run_selectors, "run_readers"), lock=(chat_services, "model_lock"),
        delete=lambda: outcome_of(lambda: services.run_delete(run=Run.objects.get(pk=run.pk))),
        act=("ask", lambda: outcome_of(lambda: chat_services.api_generation_start(
            token=token, model=model, generation_id=f"chatcmpl-{first}"))))
    return outcome["ask"], outcome["delete"]


asked, deleted = race("delete")
assert deleted == ("made", ""), deleted
assert asked == ("refused", "the model \\u2068delete first\\u2069 was deleted as the completion was being asked for; "
                            "choose another model"), asked
assert not ApiGeneration.objects.exists()

asked, deleted = race("ask")
assert asked == ("made", ""), asked
assert deleted == ("refused", "\\u2068api-owner\\u2069's /v1 completion chatcmpl-ask (project token \\u2068ci\\u2069) is "
                              "being answered by its model; wait for it to finish"), deleted
assert Run.objects.filter(name="ask first").exists()
print("ok")
"""


def test_a_completion_and_the_deletion_of_its_model_at_once_end_in_one_refusal(database_url, tmp_path):
    """A /v1 completion took no lock and left no record: one asked as its model was deleted was queued all the same,
    and a deletion while one was answered went through, the serve worker dropping the weights under it."""
    assert run_django(COMPLETION_AND_MODEL_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


CAMPAIGN_AND_PROJECT_DELETE_SCRIPT = RACE_PREAMBLE + """
from tests.webapp.factories import make_ready_version
from webapp.projects.models import Project
from webapp.review import services as review_services
from webapp.review.models import Campaign

celery_app.send_task = lambda *args, **kwargs: None  # no broker here: what is queued is not the question
owner = get_user_model().objects.create_user("campaign-race-owner", password="unused-password")


def race(first, slug):
    '''Create a review campaign on a dataset version of a new project while another thread deletes the project;
    ``first`` is "delete" (it holds its lock a moment after its check) or "create" (the creation holds its lock
    of the project a moment). Returns (creation outcome, deletion outcome).'''
    project = project_services.project_create(name=slug, slug=slug, owner=owner)
    version = make_ready_version(project, name="prefs", kind="preference", user=owner)
    outcome = race_in_order(
        first, readers=(project_services, "project_readers"), lock=(review_services, "project_lock"),
        delete=lambda: outcome_of(lambda: project_services.project_delete(project=Project.objects.get(pk=project.pk),
                                                                          confirmation=slug)),
        act=("create", lambda: outcome_of(lambda: review_services.campaign_create(
            project=project, name="race campaign", guidelines="", required_reviews=1, reviewers=[owner],
            source_version=version, user=owner))))
    return outcome["create"], outcome["delete"]


created, deleted = race("delete", "campaign-deleted-first")
assert deleted == ("made", ""), deleted
assert created == ("refused", "project \\u2068campaign-deleted-first\\u2069 was deleted as the campaign was being "
                              "created"), created
assert not Project.objects.filter(slug="campaign-deleted-first").exists()
assert not Campaign.objects.filter(name="race campaign").exists()

created, deleted = race("create", "campaign-created-first")
assert created == ("made", ""), created
assert deleted == ("refused", "review campaign \\u2068race campaign\\u2069 is loading items; wait until it is "
                              "ready"), deleted
assert Campaign.objects.filter(project__slug="campaign-created-first").count() == 1
print("ok")
"""


def test_a_review_campaign_and_the_deletion_of_its_project_at_once_end_in_one_refusal(database_url, tmp_path):
    """QA: ``review.services.campaign_create`` did not lock its project as the other creators do, so a campaign
    created while its project was being deleted waited on the deletion and then failed to save (a server error)."""
    assert run_django(CAMPAIGN_AND_PROJECT_DELETE_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"
