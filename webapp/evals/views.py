"""Evaluation pages: the list with its side-by-side comparison, the new-evaluation form, one evaluation.

Everyone in the project reads evaluations; members and owners create, cancel and delete them. Every view starts
with ``get_project_for_user``, so outsiders get 404. Model output and dataset text are rendered by autoescaped
templates only."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.chat.selectors import model_choice
from webapp.core.bidi import isolated
from webapp.core.forms import add_service_errors
from webapp.core.submissions import deleted_once_or_refused, form_send_once, sent_once_or_refused
from webapp.evals import selectors, services
from webapp.evals.forms import REWARD_TERMS, EvaluationForm, WholeRun
from webapp.evals.models import Metric
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Role
from webapp.runs.models import Run
from webapp.runs.selectors import reward_model_choices
from webapp.runs.specform import reward_rows_from_form

REWARDS_REFUSED = "The reward functions were refused: see their rows below."
NO_REWARD_FUNCTION = ("No reward function chosen: press Add a reward function and choose one, or score by exact "
                      "match.")


@login_required
@require_http_methods(["GET"])
def evaluation_list(request: HttpRequest, slug: str) -> HttpResponse:
    """Every evaluation, or with ``?model=`` (a run's page's link) that model's, and the side-by-side tables it
    stands in (the other models too: that is what they compare it with)."""
    project, membership = get_project_for_user(request.user, slug)
    every = list(selectors.evaluation_list(project=project))
    comparisons = selectors.comparison_tables(evaluations=every)
    model_id = request.GET.get("model", "").strip()
    evaluations = every
    if model_id:
        evaluations = list(selectors.evaluation_list(project=project, model_id=model_id))
        comparisons = selectors.comparisons_with(comparisons, model_id=model_id)
    choice = model_choice(project=project, ref=model_id) if model_id else None
    return render(request, "evals/list.html", {
        "project": project, "membership": membership, "evaluations": evaluations, "comparisons": comparisons,
        "model_id": model_id,
        "model_label": choice.label if choice else (evaluations[0].model_label if evaluations else model_id)})


@login_required
@require_http_methods(["GET", "POST"])
def evaluation_create(request: HttpRequest, slug: str) -> HttpResponse:
    """The form, prefilled from ``?model=`` (a run's or a base model's Evaluate… link; a GRPO or PPO run's fills in
    its reward functions, scored by them), ``?version=`` and ``?terms_of=`` (an evaluation's Evaluate again…: its
    reward functions, so that another model can be scored by the same and stand beside it)."""
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    whole_run = _whole_run(project, request.GET.get("run", "").strip())
    asked_model = whole_run.ref if whole_run else request.GET.get("model", "").strip()
    initial = {"model": asked_model, "dataset_version": request.GET.get("version", "")}
    reward_terms = (selectors.evaluation_reward_terms(project=project, public_id=request.GET.get("terms_of", ""))
                    or (selectors.model_reward_terms(project=project, model_ref=asked_model) if asked_model else []))
    if reward_terms:
        initial["score_by"] = Metric.REWARDS
    reward_errors: dict[str, list[str]] = {}
    form = EvaluationForm(request.POST or None, project=project, initial=initial, whole_run=whole_run)
    if request.method == "POST":
        reward_terms, row_errors = reward_rows_from_form(REWARD_TERMS.name, request.POST)
        reward_errors = {key: [message] for key, message in row_errors.items()}
    if request.method == "POST" and form.is_valid():
        data = form.cleaned_data
        by_rewards = data["score_by"] == Metric.REWARDS

        def create() -> str:
            version = form.versions[data["dataset_version"]]
            settings = services.EvaluationSettings(row_limit=data["row_limit"], max_new_tokens=data["max_new_tokens"],
                                                   group_by=data["group_by"].strip(),
                                                   answer_column=data["answer_column"],
                                                   reward_terms=reward_terms if by_rewards else None)
            if whole_run is not None and data["model"] == whole_run.ref:
                done = services.evaluations_create_for_run(project=project, run=whole_run.run, version=version,
                                                           settings=settings, user=request.user)
                messages.success(request, run_evaluations_message(done, run_name=whole_run.run.name))
                return reverse("runs:detail", args=[project.slug, whole_run.run.public_id]) + "#run-evaluations"
            evaluation = services.evaluation_create(project=project, model_ref=data["model"], version=version,
                                                    settings=settings, user=request.user)
            messages.success(request, f"Evaluation of {isolated(evaluation.model_label)} queued.")
            return reverse("evals:detail", args=[project.slug, evaluation.public_id])

        if not by_rewards:  # the rows are not read
            reward_errors = {}
        if by_rewards and not reward_terms and not reward_errors:  # the service would answer in the API's terms
            form.add_error(None, NO_REWARD_FUNCTION)
        elif reward_errors:  # a row's typing is said at its input first
            form.add_error(None, REWARDS_REFUSED)
        else:
            try:
                return redirect(form_send_once(request, create=create))
            except ValidationError as error:
                reward_errors = _reward_errors(form, error)
    asked_version = request.GET.get("version", "").strip()
    return render(request, "evals/create.html", {
        "project": project, "membership": membership, "form": form, "whole_run": whole_run,
        "max_run_evaluations": services.MAX_RUN_EVALUATIONS,
        "version_refused": (services.version_refusal(project=project, public_id=asked_version)
                            if request.method == "GET" and asked_version and asked_version not in form.versions
                            else ""),
        "no_models": not form.fields["model"].choices, "no_versions": not form.versions,
        "reward_field": REWARD_TERMS, "reward_initial": {REWARD_TERMS.name: reward_terms},
        "reward_errors": reward_errors,
        "reward_choices": {"reward_model.model": reward_model_choices(project=project)}},
        status=400 if request.method == "POST" else 200)


def _whole_run(project, run_id: str) -> WholeRun | None:
    """The run of ``?run=`` (a run page's *Evaluate every checkpoint…*) with its models counted, None for none of the
    project's or one with no model an evaluation can score."""
    run = Run.objects.filter(project=project, public_id=run_id).first() if run_id else None
    if run is None or not (choices := selectors.run_model_choices(project=project, run=run)):
        return None
    return WholeRun(run=run, models=len(choices), not_exported=selectors.unexported_checkpoints(run=run))


def _models(refs: list[str]) -> str:
    return f"{len(refs)} model{'s' if len(refs) != 1 else ''}"


def run_evaluations_message(done: services.RunEvaluations, *, run_name: str) -> str:
    """What a press of *every checkpoint* did, in a line: queued, skipped as evaluated so already, left for the next
    press (past the cap), left out as not exported."""
    said = [f"Queued {len(done.created)} evaluation{'s' if len(done.created) != 1 else ''} of run "
            f"{isolated(run_name)}" if done.created else f"Nothing queued for run {isolated(run_name)}"]
    if done.skipped:
        said.append(f"{_models(done.skipped)} evaluated so already (or being evaluated) skipped")
    if done.left:
        said.append(f"{_models(done.left)} more past the {services.MAX_RUN_EVALUATIONS} queued at a time: evaluate "
                    "every checkpoint again to queue them")
    if done.not_exported:
        said.append(f"{len(done.not_exported)} checkpoint{'s' if len(done.not_exported) != 1 else ''} not exported "
                    "left out: export them in the run's Checkpoints section to evaluate them")
    return "; ".join(said) + "."


def _reward_errors(form: EvaluationForm, error: ValidationError) -> dict[str, list[str]]:
    """A refusal's messages on the reward terms (``reward_terms``, ``reward_terms.<n>.<key>``), for the reward rows
    to show at their inputs; the others shown on the form."""
    if not hasattr(error, "error_dict"):
        add_service_errors(form, error)
        return {}
    ours = {key: messages for key, messages in error.message_dict.items() if key.split(".")[0] == REWARD_TERMS.name}
    rest = {key: messages for key, messages in error.message_dict.items() if key not in ours}
    if rest:
        add_service_errors(form, ValidationError(rest))
    if ours:
        form.add_error(None, REWARDS_REFUSED)
    return ours


@login_required
@require_http_methods(["GET"])
def evaluation_detail(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    evaluation = selectors.evaluation_get(project=project, public_id=public_id)
    return render(request, "evals/detail.html", {
        "project": project, "membership": membership, "evaluation": evaluation,
        "can_delete": selectors.may_delete_evaluation(membership=membership, evaluation=evaluation),
        "model_page": selectors.model_page(evaluation=evaluation),
        "rows_label": selectors.evaluation_rows_label(evaluation),
        "groups": selectors.group_rows(evaluation), "examples": selectors.example_rows(evaluation),
        "terms": selectors.term_rows(evaluation)})


@login_required
@require_POST
def evaluation_cancel(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    evaluation = selectors.evaluation_get(project=project, public_id=public_id)
    page = reverse("evals:detail", args=[project.slug, evaluation.public_id])

    def cancel() -> str:
        services.evaluation_cancel(evaluation=evaluation, user=request.user)
        messages.success(request, f"Cancelled the evaluation of {isolated(evaluation.model_label)}.")
        return page

    return redirect(sent_once_or_refused(request, create=cancel, back=page))


@login_required
@require_POST
def evaluation_delete(request: HttpRequest, slug: str, public_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    listed = reverse("evals:list", args=[project.slug])

    def delete() -> str:  # looked up here: a second click finds it gone and lands where the first did
        evaluation = selectors.evaluation_get(project=project, public_id=public_id)
        selectors.ensure_may_delete_evaluation(membership=membership, evaluation=evaluation)
        services.evaluation_delete(evaluation=evaluation, user=request.user)
        messages.success(request, f"Deleted the evaluation of {isolated(evaluation.model_label)}.")
        return listed

    return redirect(deleted_once_or_refused(request, delete=delete, gone=listed,
                                            back=reverse("evals:detail", args=[project.slug, public_id])))
