from __future__ import annotations

from dataclasses import dataclass

from django import forms

from webapp.chat.forms import ModelRefField
from webapp.chat.selectors import model_choices
from webapp.core.bidi import isolated
from webapp.evals.models import Metric
from webapp.evals.services import ANSWER_COLUMN, MAX_NEW_TOKENS, MAX_ROWS
from webapp.projects.models import Project
from webapp.review.selectors import prompt_sources
from webapp.runs.models import Run
from webapp.runs.specform import SpecField

# The launch page's reward rows (templates/runs/_spec_field.html, static/reward_rows.js), read by
# ``specform.reward_rows_from_form`` under this key, which ``services.evaluation_create``'s refusals name too.
REWARD_TERMS = SpecField(name="reward_terms", label="Reward functions", widget="rewards", default=[], optional=True,
                         help="Read when scoring by reward functions: each function's mean and their weighted total, "
                              "as a GRPO or PPO run's grpo.rewards (a GRPO/PPO run chosen above fills in its own).")


@dataclass(frozen=True, kw_only=True)
class WholeRun:
    """The New evaluation page's option for every model of a run at once (``services.evaluations_create_for_run``),
    offered with ``?run=`` (the run page's link): ``ref`` is its value in the model picker, ``models`` how many it
    scores, ``not_exported`` the steps of the run's checkpoints left out (not exported, so not served)."""

    run: Run
    models: int
    not_exported: list[int]

    @property
    def ref(self) -> str:
        return f"{self.run.public_id}:{EVERY_MODEL}"

    @property
    def option_label(self) -> str:
        return (f"Every checkpoint of run {isolated(self.run.name)}: its {self.models} exported model"
                f"{'s' if self.models != 1 else ''}")


# A model picker value no model has: a chat reference is a base model's id, a run's, or a run's and ``step-N``.
EVERY_MODEL = "every-checkpoint"


class EvaluationForm(forms.Form):
    """A new evaluation (``services.evaluation_create``): the chat's models, the prompts and sft versions a review
    campaign may take its prompts from (a run's eval set first)."""

    model = ModelRefField(help_text="A base model, a succeeded run's model or an exported checkpoint, as the chat "
                                    "serves it.", error_messages={"required": "Choose the model to evaluate."})
    dataset_version = forms.ChoiceField(
        label="Dataset version", help_text="A prompts dataset with reference answers is scored by exact match of "
                                           "greedy completions; an sft dataset by the mean loss of its completions.",
        error_messages={"required": "Choose the dataset version to evaluate on."})
    row_limit = forms.IntegerField(min_value=1, max_value=MAX_ROWS, initial=200, label="Rows",
                                   help_text="The first rows of the version.")
    max_new_tokens = forms.IntegerField(min_value=1, max_value=MAX_NEW_TOKENS, initial=32, label="Max new tokens",
                                        help_text="Per greedy completion (exact match, reward functions).")
    score_by = forms.ChoiceField(
        label="Score by", widget=forms.RadioSelect, initial=Metric.EXACT_MATCH, required=False,
        choices=[(Metric.EXACT_MATCH, "exact match"), (Metric.REWARDS, "reward functions")],
        help_text="A prompts version: exact match with its reference answers, or the reward functions below (an sft "
                  "version is scored by loss).")
    answer_column = forms.CharField(max_length=100, initial=ANSWER_COLUMN, required=False, label="Answer column",
                                    help_text="Exact match only: the prompts version's column of reference answers "
                                              "(jaxengine eval's --answer-column); empty reads 'answer'.")
    group_by = forms.CharField(max_length=100, required=False, label="Group by column",
                               help_text="Exact match and reward functions: a column (e.g. task) whose values each "
                                         "get a figure.")

    def clean_score_by(self) -> str:
        return self.cleaned_data["score_by"] or Metric.EXACT_MATCH

    def clean_answer_column(self) -> str:
        return self.cleaned_data["answer_column"].strip() or ANSWER_COLUMN

    def __init__(self, *args, project: Project, whole_run: WholeRun | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        together = [(whole_run.ref, whole_run.option_label)] if whole_run is not None else []  # a run page's link
        self.fields["model"].choices = together + [(choice.ref, choice.option_label)
                                                   for choice in model_choices(project=project)]
        sources = prompt_sources(project=project)
        self.versions = {version.public_id: version for version, _label in sources}
        self.fields["dataset_version"].choices = [(version.public_id, label) for version, label in sources]
