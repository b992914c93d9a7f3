"""Run pages: the runs table, the launch form (schema-built fields or the advanced YAML view),
the run page (progress, live charts, log, samples, lineage), its JSON endpoints, the actions
(cancel, resume, retry, edit, archive) and the compare page with its CSV download.

Viewers read; members launch and act on runs. Every view starts with ``get_project_for_user`` or
``get_run_for_user``, so outsiders get 404 everywhere. The live stream is in ``events.py``.
"""
from __future__ import annotations

import csv
import json
from typing import Any
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, QueryDict
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from jaxengine.words import counted
from webapp.chat import selectors as chat_selectors
from webapp.core.bidi import isolated
from webapp.core.forms import errors_by_key
from webapp.core.model_refs import spec_ref
from webapp.core.numbers import MAX_STORED_INT, whole_number
from webapp.core.spreadsheet import spreadsheet_cell
from webapp.core.sse import session_access_lost
from webapp.core.streaming import download_label
from webapp.core.submissions import deleted_once_or_refused, form_send_once, sent_once_or_refused
from webapp.core.text import LONG_TEXT_MAX_CHARS
from webapp.core.views import post_answered_with_a_page
from webapp.core.warnings import warning_action, warning_html
from webapp.evals import selectors as evaluation_selectors
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Role
from webapp.runs import artifacts, presets, reporting, selectors, services, serving_copies, sweeps
from webapp.runs.access import get_run_for_user
from webapp.runs.markup import render_markdown
from webapp.runs.models import ArtifactKind, Run, RunStatus
from webapp.runs.placement import DEFAULT_POOL
from webapp.runs.specform import (CONTEXT_KEY, ONE_OF_KEYS, carry_to_task, changed_from_presets, form_sections,
                                  keys_the_form_cannot_show, merge_spec, one_of_errors, read_form, scale_out_section,
                                  spec_from_keys, spec_initial, tasks, with_checkbox_values, with_form_defaults,
                                  within_model_context, without_rivals)

RUNS_PER_PAGE = 50
SAMPLES_PER_PAGE = 50
# As many runs as a sweep launches at most by default (TEMPER_SWEEP_MAX_RUNS), so a whole sweep compares at once.
MAX_COMPARE = 16


@login_required
@require_GET
def run_list(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug)
    filters = selectors.RunFilters.from_query(request.GET)
    page = Paginator(selectors.run_list(project=project, filters=filters), RUNS_PER_PAGE).get_page(
        whole_number(request.GET.get("page")))
    return render(request, "runs/list.html", {
        "project": project, "membership": membership, "runs": page.object_list, "page": page, "filters": filters,
        # GRPO and PPO runs are read by their reward; the column is there when the page lists one.
        "reward_column": any("reward" in run.final_metrics for run in page.object_list),
        "tasks": selectors.table_tasks(project=project, tasks=tasks()), "statuses": RunStatus.choices,
        "tags": selectors.project_tags(project=project),
        "sorts": [(key, selectors.SORT_LABELS[key]) for key in selectors.SORTS],
        # A sort by a final metric other than the table's Loss, Eval loss and Reward columns adds its column.
        "metric_sorts": selectors.metric_sorts(selectors.project_metric_names(project=project)),
        "metric_column": filters.metric if filters.metric not in ("loss", "eval/loss", "reward") else "",
        "can_launch": membership.can(Role.MEMBER), "max_compare": MAX_COMPARE,
        "pipelines": selectors.pipeline_list(project=project)[:10],
        # The table's own query, for the actions under it to come back to; runs a refused Compare sent back ticked.
        "table_query": _without_runs(request.GET), "ticked": set(request.GET.getlist("runs")),
        "compare_tagged_url": _compare_tagged_url(project, filters, page.paginator.count),
    })


def _compare_tagged_url(project, filters: selectors.RunFilters, count: int) -> str | None:
    """The compare page of every run the table lists when it is filtered by a tag (a sweep's, say) and
    they are few enough to compare: a sweep is launched to be compared, and ticking each row is busywork."""
    if not filters.tag or not 2 <= count <= MAX_COMPARE:
        return None
    run_ids = [run.public_id for run in selectors.run_list(project=project, filters=filters)]
    return reverse("runs:compare", args=[project.slug]) + "?" + urlencode([("runs", run_id) for run_id in run_ids])


def _without_runs(query: QueryDict) -> str:
    params = query.copy()
    params.pop("runs", None)
    return params.urlencode()


def _table_url(project, back: str | None, *, fallback: str = "", ticked: list[str] | None = None) -> str:
    """The runs table as the person left it (``back``: its search, filters, order and page, which the
    table's form sends), with ``ticked`` runs ticked; ``fallback`` when the form did not say."""
    params = QueryDict(fallback if back is None else back, mutable=True)
    params.pop("runs", None)
    if ticked:
        params.setlist("runs", ticked)
    query = params.urlencode()
    return reverse("runs:list", args=[project.slug]) + (f"?{query}" if query else "")


@login_required
@require_POST
def run_archive(request: HttpRequest, slug: str) -> HttpResponse:
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    runs = selectors.runs_by_ids(project=project, public_ids=request.POST.getlist("runs"))
    archived = request.POST.get("archived", "1") == "1"
    table = _table_url(project, request.POST.get("back"), fallback="" if archived else "archived=1")
    if not runs:
        # The button stands beside Compare under the table: pressed with nothing ticked, it says so.
        messages.error(request, f"tick the runs to {'archive' if archived else 'restore'} first")
        return redirect(table)
    try:
        count = services.run_set_archived(runs=runs, archived=archived, actor=request.user)
    except ValidationError as error:
        for text in error.messages:
            messages.error(request, text)
    else:
        messages.success(request, f"{'Archived' if archived else 'Restored'} {counted(count, 'run')}.")
    if request.POST.get("from") == "run" and len(runs) == 1:  # the run page's own button goes back to it
        return redirect("runs:detail", project.slug, runs[0].public_id)
    return redirect(table)


def _other_errors(errors: dict[str, list[str]], fields, row_prefixes: tuple[str, ...]) -> dict[str, list[str]]:
    """The errors no input of the form shows, listed under it: a pair's (``ONE_OF_KEYS``) is at its inputs."""
    at_inputs = {message for field in fields for message in one_of_errors(errors, field.name)}
    other = {key: [message for message in messages if message not in at_inputs] for key, messages in errors.items()
             if key not in {field.name for field in fields} and not key.startswith(row_prefixes)
             and key not in ("model", "data.train", "data.eval", "spec_yaml", "name", "tags", "parallel", "sweep")}
    return {key: messages for key, messages in other.items() if messages}


def _at_list_inputs(errors: dict[str, list[str]], fields) -> dict[str, list[str]]:
    """``errors`` with a list element's problems (``peft.targets.0``: the value and the allowed ones) at the list's
    input: under the form, they left the input showing nothing of what was wrong in it."""
    lists = {field.name for field in fields if field.widget == "multi"}
    placed: dict[str, list[str]] = {}
    for key, problems in errors.items():
        head, _dot, index = key.rpartition(".")
        at = placed.setdefault(head if head in lists and index.isdigit() else key, [])
        at.extend(problem for problem in problems if problem not in at)
    return placed


def _launch_context(project, membership, *, task: str, initial: dict[str, Any], errors: dict[str, list[str]],
                    yaml_text: str, mode: str, name: str, tags: str, preset_name: str | None,
                    sweep: str = "") -> dict[str, Any]:
    sections = form_sections(task)
    scale_out = scale_out_section(task)
    fields = [field for section in (*sections, scale_out) for field in section.fields]
    errors = _at_list_inputs(errors, fields)
    # Reward rows show their own errors (``grpo.rewards.1.args.pattern``) in the row.
    row_prefixes = tuple(field.name + "." for field in fields if field.widget == "rewards")
    train_choices = selectors.dataset_choices(project=project, kinds=services.train_kinds(task))
    eval_choices = selectors.dataset_choices(project=project, kinds=services.eval_kinds(task))
    model_choices = selectors.model_choices(project=project, current=initial.get("model"))
    positions = selectors.model_positions(project=project, references=[choice.ref for choice in model_choices])
    return {
        "project": project, "membership": membership, "task": task, "tasks": tasks(),
        "sections": sections, "initial": initial, "errors": errors,
        "other_errors": _other_errors(errors, fields, row_prefixes),
        "scale_out": scale_out, "pools": selectors.pool_choices(current=initial.get("pool")),
        "rivals": json.dumps(ONE_OF_KEYS),  # static/runs_new.js clears a key's rival as the key is typed
        "pool_value": initial.get("pool") or DEFAULT_POOL,
        "model_choices": [(choice.ref, choice.label, positions.get(choice.ref)) for choice in model_choices],
        "model_limits": _model_limits(task, initial, preset_name, positions.get(initial.get("model"))),
        "train_choices": train_choices, "eval_choices": eval_choices,
        # The YAML view's list of ids: evaluation data of other kinds (prompts for sft) needs its id too.
        "eval_only_choices": [choice for choice in eval_choices if choice not in train_choices],
        "train_kinds": services.train_kinds(task), "presets": presets.presets_for(task), "preset_name": preset_name,
        # Spec keys that name the project's objects are chosen from them, like the model and data.
        # A reward row's argument is keyed <function>.<argument>: the reward_model function's model too.
        "reference_choices": {"ppo.reward_model": (reward_runs := selectors.reward_model_choices(project=project)),
                              "reward_model.model": reward_runs},
        "yaml_text": yaml_text, "mode": mode, "name": name, "tags": tags, "sweep": sweep,
        "sweep_max_runs": sweeps.max_runs(),
    }


def _starting_model_asked(project, asked: str | None) -> str | None:
    """The model a fresh launch form starts from: ``asked`` (a base model page's "Launch a run from it", a checkpoint
    named either way) when the project offers it, else the project's only model a run can start from. A dataset
    version's "Launch … on it" names no model, and the demo project's form opened blank on its one model, which
    Launch then refused for want of a model."""
    choices = selectors.model_choices(project=project)
    if (model := spec_ref(asked)) in {choice.ref for choice in choices}:
        return model
    return selectors.only_starting_model(choices)


def _model_limits(task: str, initial: dict[str, Any], preset_name: str | None, positions: int | None
                  ) -> dict[str, dict[str, Any]]:
    """The chosen model's ``positions``, which ``CONTEXT_KEY``'s input says, and the value the input holds without
    a model's limit (``unlimited``: the preset's where the model's lowered it), which ``static/runs_new.js``
    starts it at, within the newly chosen model's, until someone types in it."""
    value = initial.get(CONTEXT_KEY)
    preset_start = spec_initial(with_form_defaults(task, presets.preset_spec(task, preset_name))).get(CONTEXT_KEY)
    lowered = preset_name is not None and positions is not None and value == positions and preset_start > positions
    return {CONTEXT_KEY: {"positions": positions, "unlimited": preset_start if lowered else value}}


@login_required
@require_http_methods(["GET", "POST"])
def run_create(request: HttpRequest, slug: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    source = request.POST if request.method == "POST" else request.GET
    task = source.get("task", "sft")
    if task not in tasks():
        task = "sft"
    if request.method == "GET" and (from_task := request.GET.get("from_task")) in tasks():
        # A task tab or preset sends the shown editor's inputs here, as a GET: the address holds the page, so that
        # reloading it (or going back to it) shows it again rather than sending a form again, and it can be shared.
        return _switch_task(request, project, membership, request.GET, task=from_task, new_task=task,
                            mode=request.GET.get("mode", "form"), preset_name=request.GET.get("preset"))
    if request.method == "GET":
        name, tags, errors, copy_notes = "", "", {}, []
        errors_heading = "Some of what the run used is gone"
        preset_name = request.GET.get("preset")
        starting_model = _starting_model_asked(project, request.GET.get("model"))
        if preset_name is None and selectors.starts_from_the_demo_model(project=project, model=starting_model):
            preset_name = presets.demo_preset_name(task)  # a learning rate the demo model learns at in 200 steps
        # The form holds the task's first preset when none (or one that is gone) is named: that one is marked.
        preset_name = presets.preset_named(task, preset_name)["name"]
        spec = presets.preset_spec(task, preset_name)
        duplicate = request.GET.get("from")
        if duplicate:
            _project, _membership, original = get_run_for_user(request.user, slug, duplicate)
            if original.task not in tasks():
                raise Http404("only runs trained by Temper can be duplicated")
            spec, left_out_date = services.spec_of_a_copy(original)
            task, name, preset_name = original.task, services.copy_name(original), None
            if left_out_date is not None:
                today = services.template_date_today(original)
                copy_notes.append(
                    f"{isolated(original.name)} rendered its chats with {left_out_date}, the date its launch wrote "
                    "into data.chat_template_kwargs.date_string (its model's chat template writes the day it renders "
                    f"there). This copy leaves it out: its launch writes the day it is launched, "
                    f"{f'today, {today}' if today else 'today'}. To render {left_out_date} again, set date_string "
                    "in data.chat_template_kwargs.")
            tags = ", ".join(sweeps.tags_of_a_copy(original.tags))
            # What the run started from and is gone is said at its field, which comes up empty.
            gone = [("model" if use == "model" else f"data.{use}", ref) for use, ref in original.deleted_references()]
            gone += services.deleted_reward_models(original)
            errors = {key: [f"{ref}, which {original.name} used, was deleted since; choose another"]
                      for key, ref in gone}
            # Its row kept, the model's folder deleted on disk: the launch would refuse it in these words.
            if "model" not in errors and (model_gone := services.starting_model_gone(original)):
                errors["model"] = [f"{model_gone}; choose another model"]
                gone.append(("model", original.spec.get("model")))
            # Duplicate is the way out that Resume's refusal of such a max_seq_len names: the field says what to give.
            if problem := services.saved_max_seq_len_problem(original):
                errors.setdefault("data.max_seq_len", []).append(problem)
                if not gone:
                    errors_heading = "This run's spec cannot run again as it is"
        else:
            if starting_model is not None:
                spec = {**spec, "model": starting_model}
            # A dataset version page's "Launch a … run on it": taken when the task trains on that version's kind.
            train_choices = selectors.dataset_choices(project=project, kinds=services.train_kinds(task))
            if (data := request.GET.get("data")) in {value for value, _label in train_choices}:
                spec = {**spec, "data": {**spec.get("data", {}), "train": data}}
            spec = within_model_context(task, spec, _positions_of(project, spec.get("model")))
        initial = spec_initial(with_form_defaults(task, spec))
        context = _launch_context(project, membership, task=task, initial=initial, errors=errors,
                                  yaml_text=services.spec_to_yaml(_yaml_seed(task, spec)), mode="form", name=name,
                                  tags=tags, preset_name=preset_name)
        return render(request, "runs/new.html", {**context, "errors_heading": errors_heading, "copy_notes": copy_notes})
    mode = request.POST.get("mode", "form")
    if request.POST.get("switch") in EDITORS and request.POST["switch"] != mode:
        return _switch_editor(request, project, membership, task=task, source_mode=mode)
    # A switch sent as a form: an editor too long for an address (static/runs_new.js), or a page still running the
    # script from before switches were GETs. Never read as a launch.
    if request.POST.get("switch_task") in tasks() and request.POST["switch_task"] != task:
        return _switch_task(request, project, membership, request.POST, task=task,
                            new_task=request.POST["switch_task"], mode=mode)
    if request.POST.get("apply_preset") in {preset["name"] for preset in presets.presets_for(task)}:
        return _switch_task(request, project, membership, request.POST, task=task, new_task=task, mode=mode,
                            preset_name=request.POST["apply_preset"])
    name, tags, yaml_text = request.POST.get("name", ""), request.POST.get("tags", ""), request.POST.get("spec_yaml", "")
    sweep = request.POST.get("sweep", "")
    errors: dict[str, list[str]] = {}
    spec: dict[str, Any] = {}
    try:
        spec, refused = _posted_spec(request, project, task=task, mode=mode)
        if refused is not None:
            raise refused
        task = spec.get("task", task) if spec.get("task") in tasks() else task

        def launch() -> str:
            axes = sweeps.axes_from_text(sweep)
            if axes:
                return _launch_sweep(request, project, spec=spec, axes=axes, name=name, tags=tags)
            run = services.run_create(project=project, spec=spec, user=request.user, name=name, tags=tags)
            messages.success(request, f"Run {isolated(run.name)} queued.")
            for warning in selectors.launch_warnings(run=run):
                messages.warning(request, warning_html(warning))
            return reverse("runs:detail", args=[project.slug, run.public_id])

        return redirect(form_send_once(request, create=launch))
    except ValidationError as error:
        errors = errors_by_key(error)
    if mode == "form":
        yaml_text = services.spec_to_yaml(spec)
    initial = spec_initial(spec) if spec else {}
    context = _launch_context(project, membership, task=task, initial=initial, errors=errors, yaml_text=yaml_text,
                              mode=mode, name=name, tags=tags, sweep=sweep, preset_name=None)
    if sweep.strip():
        context["errors_heading"] = "The sweep was not launched: none of its runs was made"
    return render(request, "runs/new.html", context, status=400)


def _posted_spec(request: HttpRequest, project, *, task: str, mode: str
                 ) -> tuple[dict[str, Any], ValidationError | None]:
    """The spec posted from the launch page's ``mode`` editor, and the ``ValidationError`` of YAML that
    does not read as a spec (the spec then empty) or of form inputs that cannot be read (with what the
    spec check says of the rest; the spec then holds what was read, for the form to show again)."""
    if mode == "yaml":
        try:
            return services.spec_from_yaml(request.POST.get("spec_yaml", "")), None
        except ValidationError as error:
            return {}, error
    spec, input_errors = read_form(task, request.POST)
    return spec, _with_spec_errors(project, spec, input_errors) if input_errors else None


@login_required
@require_POST
def run_check(request: HttpRequest, slug: str) -> JsonResponse:
    """The launch page's live check, as its editors are filled in (``static/runs_new.js``): what a
    launch of the posted editor would be refused for (``errors``, by key, as the page lists them after a
    refused launch), what it would warn of (``warnings``; ``actions``, beside each, where to do what it advises, or
    null: ``core.warnings.ActionWarning``) and the memory a device would need for each run (``memory``,
    ``jaxengine.memory``), from the same services as the launch; nothing is saved, and nothing queued but the count of
    an old version's turn splits (``counting``: the page asks again until it is stored)."""
    project, _membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    task = request.POST.get("task", "sft")
    try:
        spec, refused = _posted_spec(request, project, task=task if task in tasks() else "sft",
                                     mode=request.POST.get("mode", "form"))
        if refused is not None:
            raise refused
        check = services.launch_check(project=project, spec=spec, name=request.POST.get("name", ""),
                                      tags=request.POST.get("tags", ""),
                                      axes=sweeps.axes_from_text(request.POST.get("sweep", "")))
    except ValidationError as error:
        errors = errors_by_key(error)
        return JsonResponse({"errors": errors, "warnings": [], "actions": [], "memory": [], "counting": False})
    return JsonResponse({"errors": {}, "warnings": check.warnings,
                         "actions": [warning_action(warning) for warning in check.warnings], "memory": check.memory,
                         "counting": check.counting})


def _launch_sweep(request: HttpRequest, project, *, spec: dict[str, Any], axes, name: str, tags: str) -> str:
    """Launch a sweep; the page to show it on: the runs table filtered by the sweep's tag, in the order
    its runs were queued. Not the compare page: that takes at most MAX_COMPARE runs (a sweep may have
    more) and draws a run only once it logs, while the table shows every run's status as it changes,
    and its ticks open the compare page for the runs chosen."""
    launched = services.sweep_create(project=project, spec=spec, user=request.user, axes=axes, name=name, tags=tags)
    messages.success(request, f"Sweep {launched.tag}: {counted(len(launched.runs), 'run')} queued.")
    return _table_url(project, None, fallback=urlencode({"tag": launched.tag, "sort": "oldest"}))


EDITORS = ("form", "yaml")


def _switch_editor(request: HttpRequest, project, membership, *, task: str, source_mode: str) -> HttpResponse:
    """The launch page in the other editor, holding what was typed in ``source_mode``'s (the tabs send
    the shown editor here): each editor is a form of its own, so a bare switch showed the other one as
    the page was first served and a launch from it dropped what had been typed. Nothing is launched or
    checked here; inputs the form cannot read, YAML that is not a mapping, and YAML keys or choices the
    form has no input for keep their editor with the error, so that switching loses nothing."""
    name, tags, sweep = request.POST.get("name", ""), request.POST.get("tags", ""), request.POST.get("sweep", "")
    if source_mode == "yaml":
        yaml_text = request.POST.get("spec_yaml", "")
        try:
            spec = services.spec_mapping_from_yaml(yaml_text)
        except ValidationError as error:
            return render(request, "runs/new.html", _launch_context(
                project, membership, task=task, initial={}, errors=error.message_dict, yaml_text=yaml_text,
                mode="yaml", name=name, tags=tags, sweep=sweep, preset_name=None), status=400)
        if "task" in spec and spec["task"] not in tasks():
            problems = {"task": f"{spec['task']!r} is not one of {', '.join(tasks())}"}
        else:
            task = spec.get("task", task)
            problems = keys_the_form_cannot_show(task, spec)
        if problems:
            context = _launch_context(
                project, membership, task=task, initial={}, errors={key: [why] for key, why in problems.items()},
                yaml_text=yaml_text, mode="yaml", name=name, tags=tags, sweep=sweep, preset_name=None)
            context["errors_heading"] = "Fix these keys to switch to the form (or launch from here)"
            return render(request, "runs/new.html", context, status=400)
        return render(request, "runs/new.html", _launch_context(
            project, membership, task=task, initial=spec_initial(with_form_defaults(task, with_checkbox_values(task, spec))),
            errors={}, yaml_text=yaml_text, mode="form", name=name, tags=tags, sweep=sweep, preset_name=None))
    spec, input_errors = read_form(task, request.POST)
    errors = {key: [message] for key, message in input_errors.items()}
    context = _launch_context(project, membership, task=task, initial=spec_initial(spec), errors=errors,
                              yaml_text=services.spec_to_yaml(spec), mode="form" if errors else "yaml", name=name,
                              tags=tags, sweep=sweep, preset_name=None)
    context["errors_heading"] = "Fix these inputs to switch to YAML"
    return render(request, "runs/new.html", context, status=400 if errors else 200)


def _switch_task(request: HttpRequest, project, membership, data, *, task: str, new_task: str, mode: str,
                 preset_name: str | None = None) -> HttpResponse:
    """The launch page of ``new_task`` in the same editor, keeping what was chosen on ``task``'s (the
    task tabs send the shown editor here; as bare links they lost everything typed). A value someone
    chose (one that neither the schema nor a preset of ``task`` gives) is kept where ``new_task`` has
    that key; the rest of the page is ``new_task``'s first preset (``preset_name`` where given), so that a
    DPO form does not inherit the SFT preset's learning rate, and the page says what was kept and what
    was left out. The presets send the shown editor here too, with ``new_task`` = ``task``: as links they
    also lost the model, data and name picked. The editor's inputs come in the query string (``from_task``
    the task they were typed for, ``task`` and ``preset`` the page asked for): a switch is a GET, so
    that the address is the page's, to reload, go back to or share, and a reload sends no form again.
    ``data``: those inputs (``request.GET``), or the form posted where they were too long for an address."""
    name, tags, sweep = data.get("name", ""), data.get("tags", ""), data.get("sweep", "")
    if mode == "yaml":
        yaml_text = data.get("spec_yaml", "")
        try:
            current = _dotted_keys(services.spec_mapping_from_yaml(yaml_text))
        except ValidationError as error:
            return render(request, "runs/new.html", _launch_context(
                project, membership, task=task, initial={}, errors=error.message_dict, yaml_text=yaml_text,
                mode="yaml", name=name, tags=tags, sweep=sweep, preset_name=None), status=400)
    else:
        spec, input_errors = read_form(task, data)
        if input_errors:
            context = _launch_context(project, membership, task=task, initial=spec_initial(spec),
                                      errors={key: [message] for key, message in input_errors.items()},
                                      yaml_text=services.spec_to_yaml(spec), mode="form", name=name, tags=tags,
                                      sweep=sweep, preset_name=None)
            context["errors_heading"] = f"Fix these inputs to switch to {new_task}"
            return render(request, "runs/new.html", context, status=400)
        current = spec_initial(spec)
    kept, dropped = carry_to_task(task, new_task, changed_from_presets(task, current))
    for key, kinds in (("data.train", services.train_kinds(new_task)), ("data.eval", services.eval_kinds(new_task))):
        if key in kept and kept[key] not in {value for value, _label in selectors.dataset_choices(project=project, kinds=kinds)}:
            dropped[key] = f"{new_task} takes {' or '.join(kinds)} data"
            del kept[key]
    preset_name = presets.preset_named(new_task, preset_name)["name"]  # the first where none (or a gone one) is named
    spec = merge_spec(without_rivals(presets.preset_spec(new_task, preset_name), kept), spec_from_keys(kept))
    if CONTEXT_KEY not in kept:  # a value someone chose stays, for the launch to refuse if it must
        spec = within_model_context(new_task, spec, _positions_of(project, spec.get("model")))
    context = _launch_context(project, membership, task=new_task, initial=spec_initial(with_form_defaults(new_task, spec)),
                              errors={}, yaml_text=services.spec_to_yaml(_yaml_seed(new_task, spec)), mode=mode,
                              name=name, tags=tags, sweep=sweep, preset_name=preset_name)
    context["switched"] = {"from": task, "kept": sorted(kept), "dropped": dropped}
    return render(request, "runs/new.html", context)


def _positions_of(project, model: Any) -> int | None:
    """The positions starting model ``model`` (an id, or nothing chosen yet) may train on (``model_positions``)."""
    return selectors.model_positions(project=project, references=[model]).get(model) if isinstance(model, str) else None


def _dotted_keys(spec: dict[str, Any]) -> dict[str, Any]:
    """A YAML spec's values by dotted key as the form names them, with its other top-level keys (a
    misspelt ``epochs:``) as they are, so that a switch says it left them out; not the placeholders."""
    keys = spec_initial(spec)
    keys.update((key, value) for key, value in spec.items()
                if key != "task" and key not in keys and not isinstance(value, dict))
    return {key: value for key, value in keys.items() if YAML_PLACEHOLDERS.get(key) != value}


def _with_spec_errors(project, spec: dict[str, Any], input_errors: dict[str, str]) -> ValidationError:
    """The inputs that could not be read, and what the spec check says of the rest (not again of
    what they already name: ``grpo.rewards.1.args`` when ``grpo.rewards.1.args.group`` is wrong)."""
    errors = {key: [message] for key, message in input_errors.items()}
    try:
        services.plan_run(project=project, spec=spec, output_dir=services.run_output_dir("form-check"))
    except ValidationError as error:
        for key, key_messages in error.message_dict.items():
            if not any(known == key or known.startswith(key + ".") for known in input_errors):
                errors[key] = key_messages
    return ValidationError(errors)


# What the YAML editor shows for the model and data until they are chosen.
YAML_PLACEHOLDERS = {"model": "bm_…", "data.train": "dv_…"}


def _yaml_seed(task: str, spec: dict[str, Any]) -> dict[str, Any]:
    seed = {"task": task, "model": spec.get("model", YAML_PLACEHOLDERS["model"]),
            "data": {"train": YAML_PLACEHOLDERS["data.train"]}}
    return merge_spec(seed, {key: value for key, value in spec.items() if key != "output_dir"})


def _progress(run) -> dict[str, Any]:
    """The progress card's facts, for the page and ``static/runs.js``. An attempt whose worker took it and has reported
    no step of it yet is ``starting`` (loading the model and compiling: half a minute on CPU, minutes on an
    accelerator; a resumed attempt too, whose step is its checkpoint's: ``selectors.run_starting``): the card says so
    with the run's newest log line, and its elapsed time counts on from the attempt's start (the seconds since then in
    ``attempt_seconds``) after the earlier attempts' ``train_seconds``, which stay until this attempt's first step."""
    starting = selectors.run_starting(run=run)
    attempt_seconds = max(0.0, (timezone.now() - run.started_at).total_seconds()) if starting else None
    newest_line = run.log_lines.order_by("-id").values_list("message", flat=True).first() if starting else None
    return {"step": run.current_step, "total_steps": run.total_steps, "tokens": run.tokens_seen,
            "train_seconds": run.train_seconds, "status": run.status, "stopping": run.is_stopping,
            "tokens_per_second": selectors.last_value(final_metrics=run.final_metrics, name="tokens_per_second"),
            "starting": starting, "attempt_seconds": attempt_seconds, "newest_line": newest_line or "",
            "elapsed": run.train_seconds + (attempt_seconds or 0.0)}


@login_required
@require_GET
def run_detail(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    project, membership, run = get_run_for_user(request.user, slug, run_id)
    return _render_run_page(request, project, membership, run)


def _in_chart_order(series: dict[str, Any]) -> dict[str, Any]:
    # The page makes a chart per name in the JSON's order: loss first, as on the compare page.
    return {name: series[name] for name in selectors.chart_order(series)}


def _render_run_page(request, project, membership, run, *, edit: dict[str, Any] | None = None,
                     status: int = 200) -> HttpResponse:
    """The run page; ``edit`` (the details form as sent, with its ``errors`` by field) shows that form
    open with what was typed, after a refused edit."""
    from webapp.runs import pipelines

    run = selectors.run_datasets_prefetched(run=run)
    can_delete = selectors.may_delete_run(membership=membership, run=run)
    services.series_caches_renew(runs=[run])  # a run finished before the current bucket layout, once
    rerun_refusals = (services.rerun_refusals(run) if membership.can(Role.MEMBER) and run.is_finished else {})
    return render(request, "runs/detail.html", {
        "project": project, "membership": membership, "run": run, "can_act": membership.can(Role.MEMBER),
        "can_delete": can_delete,
        # What Delete frees, said in its confirmation (a walk of the run's directory: only where it is offered).
        "disk_bytes": selectors.run_disk_bytes(run=run) if can_delete and not run.is_active else None,
        "edit": edit or {**services.shown_details(run), "errors": {}},
        # What the edit form shows now, sent back with it (services.run_update_details' ``seen``).
        "edit_seen": {key: services.edit_digest(text) for key, text in services.shown_details(run).items()},
        "edit_refused": edit is not None,
        # Resume and Retry greyed, with the words a press would be refused in (only where they are offered).
        "rerun_refusals": rerun_refusals,
        # The running pipelines whose later stages Resume is refused for, linked beside its refusal.
        "resume_counted_on_by": (list({pipeline.pk: pipeline for pipeline, _index in pipelines.stages_counting_on(run)}
                                      .values()) if rerun_refusals.get("resume") else []),
        "series": _in_chart_order(selectors.metric_series(run=run)), "progress": _progress(run),
        # What the x axis by time counts the live points' wall times from (static/runs.js); a repr, never localized.
        "series_start_time": repr(start) if (start := selectors.series_start_time(run=run)) is not None else "",
        "metric_units": selectors.METRIC_UNITS_BY_PREFIX,
        # static/runs.js places the charts of metrics first logged later by the same rule.
        "leading_charts": json.dumps(selectors.LEADING_CHARTS),
        "not_finite": selectors.metrics_not_finite_now(run=run),
        # Steps that could not train, shaded and counted by static/runs.js (which adds the live ones).
        "no_signal": selectors.no_learning_signal(run=run),
        "log": selectors.log_tail(run=run),
        **_samples_context(run, {}), "lineage": selectors.lineage(run=run),
        "devices": selectors.run_devices(run=run),
        "memory": selectors.run_memory_check(run=run),
        "evaluating": selectors.run_evaluating(run=run),
        "pipeline_cancelled_note": (pipelines.resumed_alone_note(run.pipeline)
                                    if run.pipeline is not None and run.pipeline.cancelled_by else ""),
        "unserved_pool_note": selectors.unserved_pool_note(run=run),
        "across_steps": (selectors.generations_across_steps(run=run)
                         if len(selectors.sample_steps(run=run, kind="eval")) > 1 else None),
        **_checkpoints_context(run, can_delete),
        "serving_copy": selectors.serving_copy(run=run),
        **_evaluations_context(project, run, membership),
        # The chat offers a succeeded run's final model to members, archived runs' aside (chat_selectors.model_choices).
        # Nor one whose folder was deleted since (ModelChoice.gone): the chat would refuse it.
        "can_chat": (membership.can(Role.MEMBER) and not run.archived
                     and (choice := chat_selectors.model_choice(project=project, ref=run.public_id)) is not None
                     and not choice.gone),
        # Why its final model is no longer offered, when its export folder is gone, and whether it can be made again:
        # how, to the roles its Export and Retry are offered to.
        "export_gone": selectors.final_export_gone(run=run, advise=membership.can(Role.MEMBER)),
        # The next stage of a chain (SFT → DPO → …): the launch form with this run's model chosen, on its task.
        "can_launch_from": membership.can(Role.MEMBER) and selectors.offered_as_starting_model(run=run),
        "launch_task": selectors.launch_task(run=run),
        "notes_html": render_markdown(run.notes), "notes_max_chars": LONG_TEXT_MAX_CHARS, "spec_yaml": services.spec_to_yaml(run.spec),
    }, status=status)


def _evaluations_context(project, run: Run, membership) -> dict[str, Any]:
    """The Evaluations section: the newest, the scores across checkpoints (``evaluation_curves``, drawn by
    static/evaluation_curves.js), for members with exported checkpoints to score *Evaluate every checkpoint…*, and
    the checkpoints left out as not exported."""
    evaluations = evaluation_selectors.run_page_evaluations(project=project, run_id=run.public_id)
    curves = evaluation_selectors.evaluation_curves(evaluations=evaluations, run_id=run.public_id,
                                                    final_step=run.current_step)
    # Points of one step each are no curve (a lone star on an axis of nothing): the table says their figures.
    across_steps = any(len(curve["points"]) > 1 for curve in curves)
    return {
        "evaluations": evaluation_selectors.model_evaluations(evaluations=evaluations),
        "evaluation_curves": curves if across_steps else [],
        "one_step_scored": bool(curves) and not across_steps,
        "evaluate_every": (membership.can(Role.MEMBER)
                           and run.artifacts.filter(kind=ArtifactKind.CHECKPOINT).exists()),
        "not_exported": evaluation_selectors.unexported_checkpoints(run=run)}


@login_required
@require_GET
def run_checkpoints(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """The checkpoints partial (the run page loads it again when an export it shows as running ends)."""
    project, membership, run = get_run_for_user(request.user, slug, run_id)
    can_delete = selectors.may_delete_run(membership=membership, run=run)
    return render(request, "runs/_checkpoints.html", {
        "project": project, "run": run, "can_act": membership.can(Role.MEMBER), "can_delete": can_delete,
        **_checkpoints_context(run, can_delete), "launch_task": selectors.launch_task(run=run)})


def _checkpoints_context(run: Run, can_delete: bool) -> dict[str, Any]:
    """The checkpoints list and, for who may delete the run once it has ended, its *Delete the others…* plan (None
    when nothing would go), measured as the list measured each checkpoint."""
    checkpoints = selectors.checkpoint_list(run=run, deletions=can_delete)
    prune = None
    if can_delete and not run.is_active:
        sizes = {checkpoint["step"]: checkpoint["size_bytes"] for checkpoint in checkpoints
                 if checkpoint["size_bytes"] is not None}
        prune = selectors.checkpoint_prune_plan(run=run, sizes=sizes)
    return {"checkpoints": checkpoints, "checkpoint_prune": prune if prune and prune.deleted else None}


@login_required
@require_GET
def run_artifact(request: HttpRequest, slug: str, run_id: str, kind: str) -> HttpResponse:
    """Download what the run exported (``model``, ``adapter``, or ``checkpoint`` with ``?step=N``) as a
    tar; any member of the project may, as through the API (``webapp.runs.artifacts``)."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id)
    artifact = artifacts.artifact_to_download(run=run, kind=kind, step=request.GET.get("step"))
    return artifacts.artifact_tar_response(run=run, artifact=artifact, label=download_label(request),
                                           access_lost=session_access_lost(
        request, lambda account: get_run_for_user(account, slug, run_id)))


@login_required
@require_GET
def run_artifact_card(request: HttpRequest, slug: str, run_id: str, kind: str) -> HttpResponse:
    """The model card of what the run exported (``model``, ``adapter``, or ``checkpoint`` with ``?step=N``): its front
    matter as text, its body through the notes' safe Markdown renderer (raw HTML shown as text)."""
    project, _membership, run = get_run_for_user(request.user, slug, run_id)
    artifact = artifacts.artifact_to_download(run=run, kind=kind, step=request.GET.get("step"))
    front_matter, body = artifacts.split_front_matter(artifacts.model_card_text(artifact))
    return render(request, "runs/model_card.html", {"project": project, "run": run, "artifact": artifact,
                                                    "front_matter": front_matter, "card_html": render_markdown(body)})


@login_required
@require_http_methods(["GET", "POST"])
def run_serving_copy(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """GET: the final model's serving copy card (the run page asks for it again while the copy is being
    written). POST (member): make the copy (``scheme`` int8 or int4) — the first one when none is written
    automatically (``TEMPER_SERVE_QUANTIZE=none``), or again after a failure or to switch scheme — once
    per sending; asked again while it is being written, nothing more is queued."""
    if request.method == "GET":
        project, membership, run = get_run_for_user(request.user, slug, run_id)
        return render(request, "runs/_serving_copy.html", {
            "project": project, "run": run, "can_act": membership.can(Role.MEMBER),
            "serving_copy": selectors.serving_copy(run=run)})

    def make(run):
        # With TEMPER_SERVE_QUANTIZE=none a run may have no copy yet: this one is its first.
        first = (selectors.serving_copy(run=run) or {}).get("state") == "none"
        copy, queued = serving_copies.serving_copy_request(project=run.project, user=request.user, run=run,
                                                           final=True, scheme=request.POST.get("scheme", "int8"))
        messages.add_message(request, *serving_copies.request_message(
            copy, queued, of="this run's final model", meanwhile="what it serves now", again=not first))
        return run

    return _action(request, slug, run_id, make)


@login_required
@require_GET
def run_state(request: HttpRequest, slug: str, run_id: str) -> JsonResponse:
    """Progress, new metric points (after ``after_step``), new log lines (after ``after_log``), the
    state of each checkpoint's export and, with ``start_time=1``, what the series' times count from: what the run page needs to catch up, or to poll when
    server-sent events are unavailable. A poll with points (``after_step`` >= 0) never reads the run's
    series_cache, which only a whole run's series may use."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id, series_cache=False)
    # Past MAX_STORED_INT (whole_number's bound) the database could not compare with them.
    after_step = whole_number(request.GET.get("after_step", str(selectors.BEFORE_FIRST_STEP)), signed=True)
    after_log = whole_number(request.GET.get("after_log", "0"))
    if after_step is None or after_log is None:
        raise Http404("after_step and after_log are step and line numbers")
    after_steps = _after_steps(request.GET.get("after_steps"))
    state = {
        "progress": _progress(run),
        "series": selectors.metric_series(run=run, after_step=after_step, after_steps=after_steps),
        "log": [reporting.log_line_payload(line) for line in selectors.log_tail(run=run, after_id=after_log)],
        "sample_steps": selectors.sample_steps(run=run),
        "checkpoints": selectors.checkpoint_states(run=run),
    }
    # Asked by a page opened before the run's first point, to count the time of the points that come live from it.
    if request.GET.get("start_time") == "1":
        state["series_start_time"] = selectors.series_start_time(run=run)
    return JsonResponse(state)


def _after_steps(text: str | None) -> dict[str, int]:
    """``after_steps``, the last step the page holds of each metric: a JSON object of whole numbers (-1 for
    none yet, up to MAX_STORED_INT as for after_step)."""
    if not text:
        return {}
    try:
        after_steps = json.loads(text)
    except ValueError:
        after_steps = None
    if not isinstance(after_steps, dict) or not all(
            type(step) is int and selectors.BEFORE_FIRST_STEP <= step <= MAX_STORED_INT for step in after_steps.values()):
        raise Http404('after_steps is a JSON object of metric names and step numbers, e.g. {"loss": 120}')
    return after_steps


def _float_or_none(value: str | None) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except ValueError:
        return None


def _samples_context(run, query) -> dict[str, Any]:
    """The samples browser's state for ``query`` (step, kind, reward range, order, page): a click on a
    chart lands on any step, so the nearest step that has samples of the kind is shown."""
    kind = query.get("kind") if query.get("kind") in selectors.SAMPLE_KINDS else None
    steps = selectors.sample_steps(run=run, kind=kind)
    step = whole_number(query["step"], maximum=None) if query.get("step") else None
    step = selectors.nearest_step(steps, step) if steps else step
    order = query.get("order") if query.get("order") in selectors.SAMPLE_ORDERS else "position"
    filters = {"kind": kind or "", "min_reward": query.get("min_reward", "").strip(),
               "max_reward": query.get("max_reward", "").strip(), "order": order}
    min_reward, max_reward = _float_or_none(filters["min_reward"]), _float_or_none(filters["max_reward"])
    samples = selectors.sample_list(run=run, step=step, kind=kind, min_reward=min_reward,
                                    max_reward=max_reward, order=order) if steps else []
    page = Paginator(samples, SAMPLES_PER_PAGE).get_page(whole_number(query.get("page")))
    # The Reference column says what its texts are when they are all of one kind: an SFT run evaluated on
    # prompts with answers shows answers, not completions.
    reference_kinds = {selectors.sample_reference(sample)[0] for sample in page.object_list} - {""}
    return {"samples": page.object_list, "samples_page": page,
            "reference_kind": reference_kinds.pop() if len(reference_kinds) == 1 else "", "sample_step": step if steps else None,
            "sample_steps": steps, "sample_filters": filters, "sample_kinds": selectors.SAMPLE_KINDS,
            "reward_range_problem": _reward_range_problem(filters, min_reward, max_reward),
            "samples_scored": bool(steps) and selectors.samples_scored(run=run),
            "has_rollouts": any((sample.extra or {}).get("kind") == "rollout" for sample in page.object_list)}


def _reward_range_problem(filters: dict[str, str], min_reward: float | None, max_reward: float | None) -> str:
    """Why the reward range typed in the samples browser is not what filters them (its typed text is
    kept in the boxes, so the page says so rather than showing the samples as if it had not been typed)."""
    for end, text, value in (("from", filters["min_reward"], min_reward), ("to", filters["max_reward"], max_reward)):
        if text and value is None:
            return format_html("Reward {} <bdi>{}</bdi> is not a number; the samples are shown without it.", end, text)
    if min_reward is not None and max_reward is not None and min_reward > max_reward:
        return format_html("No reward is from {} to {}: give the lower bound first.", filters["min_reward"],
                           filters["max_reward"])
    return ""


@login_required
@require_GET
def run_samples(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """The samples partial (the run page loads it when a step is chosen or a chart point clicked)."""
    _project, _membership, run = get_run_for_user(request.user, slug, run_id)
    return render(request, "runs/_samples.html", {"run": run, **_samples_context(run, request.GET)})


def _action(request, slug, run_id, action) -> HttpResponse:
    """``action(run)``, once per sending of its form (retry makes a run, export queues a task), then
    the page of the run it returns."""
    project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    return redirect(sent_once_or_refused(
        request, create=lambda: reverse("runs:detail", args=[project.slug, action(run).public_id]),
        back=reverse("runs:detail", args=[project.slug, run.public_id])))


@login_required
@require_POST
def run_delete(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    listed = reverse("runs:list", args=[project.slug])

    def delete() -> str:  # looked up here: a second click finds the run gone and lands where the first did
        _project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
        selectors.ensure_may_delete_run(membership=membership, run=run)
        services.run_delete(run=run, actor=request.user)
        messages.success(request, f"Deleted the run {isolated(run.name)} ({run.public_id}) and its files.")
        return listed

    return redirect(deleted_once_or_refused(request, delete=delete, gone=listed,
                                            back=reverse("runs:detail", args=[project.slug, run_id])))


@login_required
@require_POST
def run_cancel(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    return _action(request, slug, run_id, lambda run: services.run_cancel(run=run, user=request.user))


@login_required
@require_POST
def run_resume(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    raw = request.POST.get("max_steps", "").strip()

    def resume(run):
        max_steps = whole_number(raw, maximum=None)  # run_resume names the largest count a run records
        if raw and max_steps is None:
            raise ValidationError({"max_steps": f"max_steps must be a whole number of steps, not {raw!r}"})
        return services.run_resume(run=run, user=request.user, max_steps=max_steps)

    return _action(request, slug, run_id, resume)


@login_required
@require_POST
def run_retry(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    return _action(request, slug, run_id, lambda run: services.run_retry(run=run, user=request.user))


@login_required
@require_POST
def run_export_checkpoint(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """Export a checkpoint; sent by a checkpoint's *Launch a run from it* (``then=launch``), the run's page opens
    with ``?launch=<step>``, and ``static/runs.js`` opens the launch form with that checkpoint once it is exported:
    a run starts from an exported checkpoint (``services._resolve_model``), which the train queue writes."""
    project, _membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    raw = request.POST.get("step", "")
    then_launch = request.POST.get("then") == "launch"

    def export() -> str:
        step = whole_number(raw)
        if step is None:
            raise ValidationError({"step": f"choose a checkpoint step, not {raw!r}"})
        page = reverse("runs:detail", args=[project.slug, run.public_id])
        if then_launch:  # from a page that showed it not exported: exported since, or being exported, it is not again
            state, model = selectors.checkpoint_launch_state(run=run, step=step)
            if state == "model":
                query = urlencode({"model": model, "task": selectors.launch_task(run=run)})
                return f"{reverse('runs:new', args=[project.slug])}?{query}"
            if state == "exporting":
                messages.info(request, f"Checkpoint {step} is being exported already: the launch form opens with it "
                                       "once it is done, if this page is still open.")
                return f"{page}?{urlencode({'launch': step})}"
        services.checkpoint_export_request(run=run, step=step, user=request.user)
        if not then_launch:
            messages.success(request, f"Exporting checkpoint {step}; runs can start from it once it is listed.")
            return page
        messages.success(request, f"Exporting checkpoint {step} first: a run starts from an exported checkpoint. "
                                  "The launch form opens with it once it is exported, if this page is still open; "
                                  "otherwise its Launch a run from it under Checkpoints opens it.")
        return f"{page}?{urlencode({'launch': step})}"

    return redirect(sent_once_or_refused(request, create=export,
                                         back=reverse("runs:detail", args=[project.slug, run.public_id])))


@login_required
@require_POST
def run_checkpoint_delete(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """Delete a training checkpoint (``step``) to free its disk, keeping the run (those who may delete the run:
    ``selectors.may_delete_run``); back to the run's checkpoints, saying the step and the bytes freed, or why nothing
    was deleted. A second sending finds it gone and says so."""
    project, membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    selectors.ensure_may_delete_run(membership=membership, run=run)
    raw = request.POST.get("step", "")
    # No #checkpoints fragment: a page sent to one keeps the focus where the browser scrolled, so the message
    # saying what was freed would not take it (static/forms.js), and a keyboard user would not hear it.
    page = reverse("runs:detail", args=[project.slug, run.public_id])

    def delete() -> str:
        step = whole_number(raw)
        if step is None:
            raise ValidationError({"step": f"choose a checkpoint step, not {raw!r}"})
        deleted = services.checkpoint_delete(run=run, step=step, user=request.user)
        messages.success(request, f"Deleted checkpoint {deleted.step} of {isolated(run.name)}: "
                                  f"{filesizeformat(deleted.bytes_freed)} freed.")
        return page

    return redirect(deleted_once_or_refused(request, delete=delete, back=page, gone=page))


@login_required
@require_POST
def run_checkpoints_prune(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """Delete every training checkpoint of the run but the newest and the best (``services.checkpoints_prune``; who
    may delete the run); back to its checkpoints saying what went, what was freed and what stayed, or why nothing
    was deleted."""
    project, membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    selectors.ensure_may_delete_run(membership=membership, run=run)
    page = reverse("runs:detail", args=[project.slug, run.public_id])  # no fragment: as run_checkpoint_delete

    def prune() -> str:
        pruned = services.checkpoints_prune(run=run, user=request.user)
        if not pruned.deleted:
            messages.info(request, "No checkpoint was deleted: every one left is kept.")
            return page
        steps = ", ".join(str(deleted.step) for deleted in pruned.deleted)
        messages.success(request, f"Deleted {counted(len(pruned.deleted), 'checkpoint')} of {isolated(run.name)} "
                                  f"(steps {steps}): {filesizeformat(pruned.bytes_freed)} freed. Kept: "
                                  f"{selectors.kept_in_words(pruned.kept)}.")
        return page

    return redirect(deleted_once_or_refused(request, delete=prune, back=page))


@login_required
@require_POST
def run_checkpoint_serving_copy(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """Make the quantized serving copy of an exported checkpoint (``scheme`` int8 or int4), which the chat
    and the API then serve for it; asked again while it is being written, nothing more is queued."""
    raw_step, scheme = request.POST.get("step", ""), request.POST.get("scheme", "int8")

    def make(run):
        step = whole_number(raw_step)
        if step is None:
            raise ValidationError({"step": f"choose a checkpoint step, not {raw_step!r}"})
        copy, queued = serving_copies.serving_copy_request(project=run.project, user=request.user, run=run,
                                                           step=step, scheme=scheme)
        messages.add_message(request, *serving_copies.request_message(
            copy, queued, of=f"checkpoint {step}", meanwhile="the unquantized checkpoint"))
        return run

    return _action(request, slug, run_id, make)


@login_required
@post_answered_with_a_page("runs:detail")
def run_edit(request: HttpRequest, slug: str, run_id: str) -> HttpResponse:
    """Rename the run, set its tags and notes; a refused edit shows the form again as it was sent
    (notes can be long: they are not thrown away for a blank name)."""
    project, membership, run = get_run_for_user(request.user, slug, run_id, write=True)
    fields = {key: request.POST[key] for key in ("name", "tags", "notes") if key in request.POST}
    seen = {key: request.POST[f"seen_{key}"] for key in fields if f"seen_{key}" in request.POST}
    try:
        services.run_update_details(run=run, **fields, seen=seen)
    except ValidationError as error:
        run.refresh_from_db()
        # What this person changed comes back as they sent it; the rest as it is now.
        changed = {key: value for key, value in fields.items() if seen.get(key) != services.edit_digest(value)}
        edit = {**services.shown_details(run), **changed, "errors": error.message_dict}
        return _render_run_page(request, project, membership, run, edit=edit, status=400)
    return redirect("runs:detail", project.slug, run.public_id)


def _compare_runs(request, slug):
    project, membership = get_project_for_user(request.user, slug)
    # A finished run's series cache is about 1 MB of JSON, three quarters of it buckets the page does not draw.
    runs = selectors.runs_by_ids(project=project, public_ids=request.GET.getlist("runs"), series_cache=False)
    return project, membership, runs


@login_required
@require_http_methods(["GET", "POST"])
def run_compare(request: HttpRequest, slug: str) -> HttpResponse:
    if request.method == "POST":
        # The Runs page's checkboxes arrive by POST (their form also archives, so it carries a CSRF
        # token, which a GET would put into the address bar, the history and the server logs).
        project, _membership = get_project_for_user(request.user, slug)
        ticked = request.POST.getlist("runs")
        if not 2 <= len(ticked) <= MAX_COMPARE:  # back to the table as it was, the ticks kept
            messages.error(request, f"choose between 2 and {MAX_COMPARE} runs of this project to compare")
            return redirect(_table_url(project, request.POST.get("back"), ticked=ticked))
        query = urlencode([("runs", run_id) for run_id in ticked])
        return redirect(reverse("runs:compare", args=[project.slug]) + f"?{query}")
    project, membership, runs = _compare_runs(request, slug)
    # Ids of the address that are no run of the project (deleted since, mistyped, or another project's) are named.
    shown = {run.public_id for run in runs}
    missing_runs = [public_id for public_id in dict.fromkeys(request.GET.getlist("runs")) if public_id not in shown]
    if not 2 <= len(runs) <= MAX_COMPARE:
        problem = f"choose between 2 and {MAX_COMPARE} runs of this project to compare"
        if missing_runs:
            problem += (f": {', '.join(missing_runs)} {'is not a run' if len(missing_runs) == 1 else 'are not runs'} "
                        "of this project (deleted since, or mistyped)")
        messages.error(request, problem)
        return redirect("runs:list", project.slug)
    services.series_caches_renew(runs=runs)  # runs finished before the current bucket layout, once
    by_pk = selectors.runs_metric_series(runs=runs, max_points=selectors.COMPARE_MAX_POINTS)
    series = {run.public_id: by_pk[run.pk] for run in runs}
    names = selectors.chart_order({name for run_series in series.values() for name in run_series})
    final_names = selectors.final_order(name for name in names if any(name in run.final_metrics for run in runs))
    diff = selectors.config_diff(runs=runs)
    # A reward model's accuracy and a DPO run's rewards/accuracies, say, on one chart, and in one final column.
    shared = selectors.shared_charts(runs=runs, series=series)
    generation_steps, generation_steps_problem = _generation_steps(request.GET.get("gen", ""), runs)
    sent = {run_id: selectors.series_with_shared_x(run_series) for run_id, run_series in series.items()}
    return render(request, "runs/compare.html", {
        "project": project, "membership": membership, "runs": runs,
        # group_by: the run's data.eval_group_by, whose eval/<metric>/<group> are drawn as one chart a metric.
        "metric_units": selectors.METRIC_UNITS_BY_PREFIX,
        "chart_data": {"runs": [{"id": run.public_id, "name": run.name, "active": run.is_active,
                                 "group_by": run.data_spec.get("eval_group_by") or ""}
                                for run in runs],
                       # Each run's series, and their x (step, tokens, time) each sent once (series_with_shared_x).
                       "series": {run_id: values for run_id, (values, _xs) in sent.items()},
                       "x": {run_id: xs for run_id, (_values, xs) in sent.items()}, "names": names, "shared": shared},
        "diff": diff, "config_differs": any(row["differs"] for row in diff),
        "hyperparameters": selectors.hyperparameter_axes(runs=runs, diff=diff, metric_names=final_names),
        "final": selectors.final_table(runs=runs, names=names, shared=shared),
        "generations": selectors.side_by_side(runs=runs, steps=generation_steps),
        "generation_steps_problem": generation_steps_problem,
        "query": "&".join(f"runs={run.public_id}" for run in runs),
        "missing_runs": missing_runs,
    })


def _generation_steps(text: str, runs) -> tuple[dict[int, int], str]:
    """The steps the generations side by side show, by run pk, from the address's ``gen`` (``<run id>:<step>``,
    comma-separated, as static/runs_compare.js writes it), and what in it was left out, said on the page."""
    by_id = {run.public_id: run for run in runs}
    steps, left_out = {}, []
    for part in filter(None, (part.strip() for part in text.split(","))):
        public_id, _, step = part.partition(":")
        number = whole_number(step)
        if public_id in by_id and number is not None:
            steps[by_id[public_id].pk] = number
        else:
            left_out.append(part)
    problem = (f"gen={','.join(left_out)} was left out: each is <run id>:<step> of a run compared here, so those runs "
               "are shown at their last evaluated step" if left_out else "")
    return steps, problem


@login_required
@require_GET
def run_compare_csv(request: HttpRequest, slug: str) -> HttpResponse:
    """Every stored metric point of the chosen runs (not downsampled), one row each; names that a
    spreadsheet would run as formulas are written as text (``spreadsheet_cell``). The run page's download asks for
    its one run, and its file is named for it."""
    project, _membership, runs = _compare_runs(request, slug)
    if not runs:
        raise Http404("no runs of this project chosen")
    from webapp.runs.models import MetricPoint

    response = HttpResponse(content_type="text/csv")
    named = f"{project.slug}-{runs[0].public_id}" if len(runs) == 1 else project.slug
    response["Content-Disposition"] = f'attachment; filename="{named}-metrics.csv"'
    writer = csv.writer(response)
    writer.writerow(["run_id", "run_name", "step", "metric", "value", "tokens", "wall_time"])
    names = {run.pk: (run.public_id, run.name) for run in runs}
    points = (MetricPoint.objects.filter(run__in=runs).order_by("run_id", "name", "step")
              .values_list("run_id", "step", "name", "value", "tokens", "wall_time"))
    for run_pk, step, name, value, tokens, wall_time in points.iterator(chunk_size=5000):
        run_id, run_name = names[run_pk]
        writer.writerow([run_id, spreadsheet_cell(run_name), step, spreadsheet_cell(name), repr(value), tokens,
                         f"{wall_time:.3f}"])
    return response




PIPELINE_EXAMPLE = """name: sft-dpo-serve
stages:
  - name: sft
    spec:
      task: sft
      model: {model}
      data: {{train: {sft}, eval: {eval}}}
      peft: {{method: lora, rank: 16, alpha: 32}}
      train: {{max_steps: 200, batch_size: 8, eval_every: 50, save_every: 50}}
  # a guard stops the pipeline when a metric got worse than the previous stage's. Both stages must measure it
  # alike: the same task (and dpo.loss), and for an eval/ metric the same data.eval; e.g. more sft on new data,
  # checked for forgetting on the same held-out data:
  # - name: sft-more
  #   spec:
  #     task: sft
  #     data: {{train: dv_…, eval: {eval}}}
  #     train: {{max_steps: 100, batch_size: 8, eval_every: 50, save_every: 50}}
  #   guard: {{metric: eval/loss, max_drop_percent: 5, higher_is_better: false}}
  - name: dpo
    # model: the previous stage's exported model
    spec:
      task: dpo
      data: {{train: {preference}}}
      train: {{max_steps: 100, batch_size: 8, save_every: 50}}
  - name: serve
    # the last model's serving copy, quantized (int8 or int4), with its perplexity and agreement
    export: {{quantize: int8}}
"""


@login_required
@require_http_methods(["GET", "POST"])
def pipeline_create(request: HttpRequest, slug: str) -> HttpResponse:
    from webapp.runs import pipelines

    project, membership = get_project_for_user(request.user, slug, min_role=Role.MEMBER)
    errors: dict[str, list[str]] = {}
    if request.method == "POST":
        text = request.POST.get("document", "")
        try:
            document = services.load_yaml(text, field="document", source="document", unique_keys=True)

            def start() -> str:
                pipeline = pipelines.pipeline_create(project=project, document=document, user=request.user)
                messages.success(request, f"Pipeline {isolated(pipeline.name)} started.")
                return reverse("runs:pipeline", args=[project.slug, pipeline.public_id])

            return redirect(form_send_once(request, create=start))
        except ValidationError as error:
            errors = errors_by_key(error)
    else:
        # The first starting model whose folder is there: a pipeline from a gone one is refused at its first stage.
        model = next((choice.ref for choice in selectors.model_choices(project=project) if not choice.gone), "bm_…")
        train = selectors.newest_ready_version(project=project, kinds=("sft",))
        text = PIPELINE_EXAMPLE.format(
            model=model, sft=train or "dv_…",
            eval=selectors.newest_ready_version(project=project, kinds=("sft", "prompts"), other_than=train) or "dv_…",
            preference=selectors.newest_ready_version(project=project, kinds=("preference",)) or "dv_…")
    return render(request, "runs/pipeline_new.html", {"project": project, "membership": membership,
                                                      "document": text, "errors": errors},
                  status=400 if errors else 200)


@login_required
@require_GET
def pipeline_detail(request: HttpRequest, slug: str, pipeline_id: str) -> HttpResponse:
    from webapp.runs import pipelines

    project, membership = get_project_for_user(request.user, slug)
    pipeline = selectors.pipeline_get(project=project, public_id=pipeline_id)
    runs = {run.pipeline_stage: run for run in pipeline.runs.all()}
    stages = [{"index": index, "stage": stage, "run": runs.get(index),
               "deleted": index not in runs and pipelines.stage_ran(pipeline, index),
               "export_status": pipelines.export_stage_status(pipeline, index) if "export" in stage else None}
              for index, stage in enumerate(pipeline.stages)]
    return render(request, "runs/pipeline.html", {"project": project, "membership": membership,
                                                  "pipeline": pipeline, "stages": stages,
                                                  "can_cancel": selectors.may_cancel_pipeline(membership=membership),
                                                  "result_deleted": pipelines.result_deleted(pipeline),
                                                  "export": pipelines.export_result(pipeline)})


@login_required
@require_POST
def pipeline_cancel(request: HttpRequest, slug: str, pipeline_id: str) -> HttpResponse:
    from webapp.runs import pipelines

    project, membership = get_project_for_user(request.user, slug)
    selectors.ensure_may_cancel_pipeline(membership=membership)
    pipeline = selectors.pipeline_get(project=project, public_id=pipeline_id)
    page = reverse("runs:pipeline", args=[project.slug, pipeline.public_id])

    def cancel() -> str:
        pipelines.pipeline_cancel(pipeline=pipeline, user=request.user)
        messages.success(request, f"Pipeline {isolated(pipeline.name)} cancelled.")
        return page

    try:
        return redirect(form_send_once(request, create=cancel))
    except ValidationError as error:
        for text in error.messages:
            messages.error(request, text)
        return redirect(page)
