"""A registered model is judged again at every load by the models root's project rule (``projects/<slug>/`` is that
project's alone). A registration made before the root was split between projects kept its stored path into what is
now another project's folder, and a link swapped since registration could lead into one: the chat served that
project's weights, a launch trained on them, and the model page showed them as the project's own. Each load now
refuses such a model, in registration's words (``inspection.check_registered_model_dir``)."""
import html
import shutil

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.factories import make_base_model, make_ready_version, write_model_dir
from webapp.basemodels.services import basemodel_register
from webapp.chat import arena, selectors as chat_selectors, services as chat_services
from webapp.chat.models import Conversation, Message
from webapp.review.services import _generation_model
from webapp.runs.models import Run


@pytest.fixture
def models_root(settings, tmp_path):
    """alpha's own folder, the other team's (alpha-elsewhere's) with its private fine-tune, and shared/."""
    root = settings.MODELS_ROOT = tmp_path / "models"
    write_model_dir(root / "shared" / "base")
    write_model_dir(root / "projects" / "alpha" / "own-ft")
    write_model_dir(root / "projects" / "alpha-elsewhere" / "secret-ft")
    return root.resolve()


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(chat_services.celery_app, "send_task", lambda name, args, queue, **options: calls.append(name))
    return calls


def registration_refusal(project, path: str) -> str:
    """What registering ``path`` in ``project`` says today."""
    with pytest.raises(ValidationError) as excinfo:
        basemodel_register(project=project, name="again", path=path, user=None)
    [message] = excinfo.value.message_dict["path"]
    return message


@pytest.fixture
def before_the_split(team, models_root):
    """alpha's registration of the other team's fine-tune, written as registration wrote it before projects had
    folders (its resolved path, facts read then)."""
    return make_base_model(team.project, name="borrowed",
                           path=str(models_root / "projects" / "alpha-elsewhere" / "secret-ft"))


@pytest.fixture
def swapped(team, models_root):
    """A shared model registered by alpha, its directory then replaced by a link into the other team's folder."""
    model_dir = write_model_dir(models_root / "shared" / "swapped")
    base_model = basemodel_register(project=team.project, name="swapped", path="shared/swapped", user=team.owner)
    shutil.rmtree(model_dir)
    model_dir.symlink_to(models_root / "projects" / "alpha-elsewhere" / "secret-ft")
    return base_model


def conversation_with(team, client_for, base_model) -> Conversation:
    response = client_for(team.teammate).post(reverse("chat:list", args=[team.project.slug]),
                                              {"model": base_model.public_id, "system_prompt": "", "temperature": 0.5, "top_p": 0.9,
                                               "top_k": 40, "max_tokens": 64})
    assert response.status_code == 302
    return Conversation.objects.get(project=team.project, user=team.teammate, model_ref=base_model.public_id)


@pytest.mark.parametrize("case", ["before_the_split", "swapped"])
def test_a_chat_with_a_model_in_another_projects_folder_is_refused_on_the_page_and_never_sent(
        team, client_for, models_root, sent, django_capture_on_commit_callbacks, request, case):
    base_model = request.getfixturevalue(case)
    words = registration_refusal(team.project, base_model.path)
    assert "does not exist" in words  # another project's folder is told apart from nothing missing
    conversation = conversation_with(team, client_for, base_model)
    client = client_for(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        page = client.get(reverse("chat:detail", args=[team.project.slug, conversation.public_id])).content.decode()
    assert html.escape(words) in page and 'id="chat-form"' not in page
    assert "secret-ft" not in page or case == "before_the_split"  # a swapped link's target is never named
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("chat:send", args=[team.project.slug, conversation.public_id]),
                               {"content": "What is 2 + 2?"})
    assert response.status_code == 409
    assert response.json()["error"].startswith(words) and "register it again" in response.json()["error"]
    assert sent == [] and not Message.objects.filter(conversation=conversation).exists()


def test_the_arena_draws_no_refused_model_and_compare_mode_refuses_it(team, models_root, before_the_split, sent):
    for name in ("falcon", "heron"):
        make_base_model(team.project, name=name, path=str(write_model_dir(models_root / "shared" / name)))
    choices = chat_selectors.model_choices(project=team.project)
    refused = next(choice for choice in choices if choice.ref == before_the_split.public_id)
    assert refused.refused.startswith(registration_refusal(team.project, before_the_split.path))
    for _ in range(6):
        battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Name a colour.", choices=choices)
        assert before_the_split.public_id not in (battle.side_a.model_ref, battle.side_b.model_ref)
    with pytest.raises(chat_services.ChatError, match="does not exist"):
        arena.battle_create(project=team.project, user=team.teammate, prompt="Name a colour.", choices=choices,
                            compare=(choices[1], refused))


def test_a_review_generation_with_it_is_refused_naming_the_field(team, models_root, before_the_split):
    with pytest.raises(ValidationError) as excinfo:
        _generation_model(team.project, "model_a", before_the_split.public_id)
    [message] = excinfo.value.message_dict["model_a"]
    assert message.startswith(registration_refusal(team.project, before_the_split.path))


@pytest.mark.parametrize("case", ["before_the_split", "swapped"])
def test_a_launch_from_it_is_refused_with_a_form_error(team, client_for, models_root, request, case):
    base_model = request.getfixturevalue(case)
    version = make_ready_version(team.project, name="chats", kind="sft")
    response = client_for(team.teammate).post(f"/p/{team.project.slug}/runs/new/", {
        "mode": "form", "task": "sft", "name": "borrowed-ft", "model": base_model.public_id,
        "data.train": version.public_id, "train.max_steps": "5", "train.batch_size": "2"})
    assert response.status_code == 400
    page = response.content.decode()
    assert f"<code>model</code>: {html.escape(registration_refusal(team.project, base_model.path))}" in page
    assert not Run.objects.filter(project=team.project).exists()


@pytest.mark.parametrize("case", ["before_the_split", "swapped"])
def test_the_model_page_says_it_cannot_be_loaded_and_what_to_do(team, client_for, models_root, request, case):
    base_model = request.getfixturevalue(case)
    page = client_for(team.owner).get(reverse("basemodels:detail", args=[team.project.slug, base_model.public_id]))
    assert page.status_code == 200
    text = page.content.decode()
    assert "This model cannot be loaded" in text
    assert html.escape(registration_refusal(team.project, base_model.path)) in text
    assert "register it again from there, then unregister this registration" in text
    assert "Launch a run from it" not in text and "Chat with it" not in text and "<h2>config.json</h2>" not in text
    assert 'id="licence"' not in text  # its README.md and files may be another project's


def test_a_file_linked_into_another_projects_folder_after_registration_is_refused(team, client_for, models_root, sent):
    model_dir = write_model_dir(models_root / "projects" / "alpha" / "mixed")
    base_model = basemodel_register(project=team.project, name="mixed", path="projects/alpha/mixed", user=team.owner)
    weights = model_dir / "model.safetensors"
    weights.unlink()
    weights.symlink_to(models_root / "projects" / "alpha-elsewhere" / "secret-ft" / "model.safetensors")
    choice = chat_selectors.model_choice(project=team.project, ref=base_model.public_id)
    assert choice.refused == (f"{weights} links out of the folders this project may read ({models_root / 'shared'}, "
                              f"{models_root / 'projects' / 'alpha'}); copy the file into the model's directory")
    page = client_for(team.owner).get(reverse("basemodels:detail", args=[team.project.slug, base_model.public_id]))
    assert html.escape(choice.refused) in page.content.decode()


def test_a_model_of_the_projects_own_or_the_shared_folder_still_loads(team, client_for, models_root, sent,
                                                                      django_capture_on_commit_callbacks):
    for path in ("shared/base", "projects/alpha/own-ft"):
        base_model = basemodel_register(project=team.project, name=path.replace("/", "-"), path=path, user=team.owner)
        assert chat_selectors.model_choice(project=team.project, ref=base_model.public_id).refused == ""
        conversation = conversation_with(team, client_for, base_model)
        with django_capture_on_commit_callbacks(execute=True):
            response = client_for(team.teammate).post(
                reverse("chat:send", args=[team.project.slug, conversation.public_id]), {"content": "Hi"})
        assert response.status_code == 200
        page = client_for(team.owner).get(reverse("basemodels:detail", args=[team.project.slug, base_model.public_id]))
        assert "This model cannot be loaded" not in page.content.decode()
    assert sent.count("worker.tasks.serve.generate") == 2


def test_a_v1_completion_with_it_is_refused_before_a_worker_is_asked(team, models_root, before_the_split, monkeypatch):
    import json

    from django.test import Client

    from webapp.chat import openai_api
    from webapp.chat.tokens import project_token_create

    asked = []
    monkeypatch.setattr(openai_api.celery_app, "send_task", lambda *args, **kwargs: asked.append(args))
    _token, secret = project_token_create(user=team.teammate, project=team.project, name="x")
    response = Client().post("/v1/chat/completions", json.dumps({
        "model": before_the_split.public_id, "messages": [{"role": "user", "content": "hi"}]}),
        content_type="application/json", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 409
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("model_not_loadable", "model")
    assert error["message"].startswith(registration_refusal(team.project, before_the_split.path))
    assert asked == []


def test_a_resume_or_retry_of_a_run_whose_model_now_lies_in_another_projects_folder_is_refused_up_front(
        team, client_for, models_root, monkeypatch, django_capture_on_commit_callbacks):
    """A run launched from a shared model whose directory was then swapped for a link into another project's folder:
    its resume (the page's and the API's) and its retry were queued, and only the train worker refused the model
    (``train.check_model_dir``), the run failed again. Each is refused at once in registration's words, nothing
    queued and the run as it was."""
    import json

    from django.test import Client

    from webapp.api.services import token_create
    from webapp.runs import services as run_services
    from webapp.runs.models import RunStatus

    queued = []
    monkeypatch.setattr(run_services.celery_app, "send_task", lambda name, *args, **kwargs: queued.append(name))
    model_dir = write_model_dir(models_root / "shared" / "later-swapped")
    base_model = basemodel_register(project=team.project, name="later-swapped", path="shared/later-swapped",
                                    user=team.owner)
    version = make_ready_version(team.project, name="chats", kind="sft")
    run = run_services.run_create(project=team.project, user=team.teammate, spec={
        "task": "sft", "model": base_model.public_id, "data": {"train": version.public_id, "max_seq_len": 128},
        "train": {"max_steps": 5, "batch_size": 2}})
    Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED, error_message="the worker stopped")
    shutil.rmtree(model_dir)
    model_dir.symlink_to(models_root / "projects" / "alpha-elsewhere" / "secret-ft")
    words = registration_refusal(team.project, base_model.path)
    queued.clear()

    client = client_for(team.teammate)
    for action in ("resume", "retry"):
        with django_capture_on_commit_callbacks(execute=True):
            response = client.post(reverse(f"runs:{action}", args=[team.project.slug, run.public_id]), follow=True)
        shown = [str(message) for message in response.context["messages"]]
        assert len(shown) == 1 and shown[0].startswith(words), (action, shown)
    _token, secret = token_create(user=team.teammate, name="resume")
    with django_capture_on_commit_callbacks(execute=True):
        response = Client(HTTP_AUTHORIZATION=f"Bearer {secret}").post(
            f"/api/v1/projects/{team.project.slug}/runs/{run.public_id}/resume/", json.dumps({"max_steps": 9}),
            content_type="application/json")
    assert response.status_code == 400
    [message] = response.json()["errors"]["model"]
    assert message.startswith(words)
    assert queued == [] and Run.objects.filter(project=team.project).count() == 1
    run.refresh_from_db()
    assert (run.status, run.attempt, run.total_steps, run.error_message) == (RunStatus.FAILED, 1, 5, "the worker stopped")


@pytest.mark.parametrize("case", ["before_the_split", "swapped"])
def test_the_run_page_greys_resume_and_retry_of_a_run_whose_model_is_refused_saying_why(
        team, client_for, models_root, sent, request, case):
    """Resume and Retry were offered on the page of a finished run whose model may no longer be loaded, and refused
    only once pressed. They are greyed now, each with the words its press is refused in (``rerun_refusals``, which
    ``run_resume`` and ``run_retry`` raise); a run whose model loads keeps both buttons."""
    from webapp.runs import services as run_services
    from webapp.runs.models import RunStatus

    model_dir = write_model_dir(models_root / "shared" / "fine")
    fine = basemodel_register(project=team.project, name="fine", path="shared/fine", user=team.owner)
    version = make_ready_version(team.project, name="chats", kind="sft")

    def failed_run(base_model):
        run = run_services.run_create(project=team.project, user=team.teammate, spec={
            "task": "sft", "model": base_model.public_id, "data": {"train": version.public_id, "max_seq_len": 128},
            "train": {"max_steps": 5, "batch_size": 2}})
        Run.objects.filter(pk=run.pk).update(status=RunStatus.FAILED)
        run.refresh_from_db()
        return run

    refused_run = failed_run(fine)
    if case == "before_the_split":  # a registration made before the split, as the fixture writes it
        Run.objects.filter(pk=refused_run.pk).update(resolved_spec={
            **refused_run.resolved_spec, "model": request.getfixturevalue(case).path})
    else:
        shutil.rmtree(model_dir)
        model_dir.symlink_to(models_root / "projects" / "alpha-elsewhere" / "secret-ft")
    refused_run.refresh_from_db()
    client = client_for(team.teammate)
    page = client.get(reverse("runs:detail", args=[team.project.slug, refused_run.public_id])).content.decode()
    reasons = {}
    for action, service in (("resume", run_services.run_resume), ("retry", run_services.run_retry)):
        with pytest.raises(ValidationError) as refused:
            service(run=refused_run, user=team.teammate)
        [reasons[action]] = refused.value.messages
        assert f'id="{action}-refused">' in page and f'aria-describedby="{action}-refusal"' in page
        assert f"action=\"{reverse(f'runs:{action}', args=[team.project.slug, refused_run.public_id])}\"" not in page
    assert f'<p class="card run-message" id="resume-refusal">Resume: {html.escape(reasons["resume"])}</p>' in page
    assert f'<p class="card run-message" id="retry-refusal">Retry: {html.escape(reasons["retry"])}</p>' in page
    assert "cannot be resumed: once the model is registered again from its new folder" in reasons["resume"]
    assert "cannot be retried: once the model is registered again from its new folder" in reasons["retry"]

    other = failed_run(basemodel_register(project=team.project, name="base", path="shared/base", user=team.owner))
    page = client.get(reverse("runs:detail", args=[team.project.slug, other.public_id])).content.decode()
    assert "-refused" not in page and "-refusal" not in page
    for action in ("resume", "retry"):
        assert f"action=\"{reverse(f'runs:{action}', args=[team.project.slug, other.public_id])}\"" in page
