from __future__ import annotations

from django import forms

from webapp.chat.forms import ModelRefField
from webapp.chat.selectors import model_choices
from webapp.evals.models import Metric
from webapp.evals.services import ANSWER_COLUMN, MAX_NEW_TOKENS, MAX_ROWS
from webapp.projects.models import Project
from webapp.review.selectors import prompt_sources
from webapp.runs.specform import SpecField

# The launch page's reward rows (templates/runs/_spec_field.html, static/reward_rows.js), read by
# ``specform.reward_rows_from_form`` under this key, which ``services.evaluation_create``'s refusals name too.
REWARD_TERMS = SpecField(name="reward_terms", label="Reward functions", widget="rewards", default=[], optional=True,
                         help="Read when scoring by reward functions: each function's mean and their weighted total, "
                              "as a GRPO or PPO run's grpo.rewards (a GRPO/PPO run chosen above fills in its own).")


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

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["model"].choices = [(choice.ref, choice.option_label) for choice in model_choices(project=project)]
        sources = prompt_sources(project=project)
        self.versions = {version.public_id: version for version, _label in sources}
        self.fields["dataset_version"].choices = [(version.public_id, label) for version, label in sources]
