from __future__ import annotations

import json

from django import forms

from jaxengine.words import counted
from webapp.datasets.models import DatasetVersion, VersionStatus
from webapp.projects.models import Project
from webapp.chat.forms import (THINKING_CHOICES, THINKING_HELP, VARIABLE_PREFIX, ModelRefField, template_variable_field,
                               thinking_choice)
from webapp.chat.selectors import TemplateVariable, chat_template_variables, model_choices, thinking_defaults
from webapp.core.bidi import isolated
from webapp.core.forms import TypedTextField
from webapp.core.text import LONG_TEXT_MAX_CHARS
from webapp.review.models import MAX_REQUIRED_REVIEWS, Choice, Label
from webapp.review.selectors import default_required_reviews, possible_reviewers, prompt_sources
from webapp.review.services import MAX_GENERATED_PROMPTS, TEMPLATE_CHECKED_PROMPTS


class CampaignSettingsForm(forms.Form):
    # The length is the service's to refuse (its message names the limit); the browser's maxlength warns first.
    guidelines = forms.CharField(widget=forms.Textarea(attrs={"rows": 8, "maxlength": LONG_TEXT_MAX_CHARS}),
                                 required=False, help_text="Markdown, shown beside every item.")
    required_reviews = forms.IntegerField(min_value=1, max_value=MAX_REQUIRED_REVIEWS, initial=2,
                                          label="Reviews per item",
                                          help_text="An item is complete once this many reviewers have answered it.")
    reviewers = forms.ModelMultipleChoiceField(
        queryset=None, widget=forms.CheckboxSelectMultiple, help_text="Project members and owners.",
        error_messages={
            "required": "Tick at least one reviewer: the items wait in the queues of those ticked.",
            # Someone ticked from a page shown before another owner removed them or made them a viewer (or an
            # administrator deactivated them). Not named: the id sent could be anyone's, and the list drawn
            # again shows who may review now.
            "invalid_choice": "A reviewer you ticked can no longer review: they left the project, were made a "
                              "viewer or were deactivated since the page was shown. Tick the reviewers again from "
                              "the list as it is now.",
        })

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["reviewers"].queryset = possible_reviewers(project=project)
        self.fields["reviewers"].label_from_instance = lambda user: isolated(user.get_username())
        if "required_reviews" not in self.initial:
            self.fields["required_reviews"].initial = default_required_reviews(project=project)
        if "reviewers" not in self.initial:  # a new campaign: the team reviews, unless someone is unticked
            self.fields["reviewers"].initial = list(self.fields["reviewers"].queryset)


class CampaignCreateForm(CampaignSettingsForm):
    field_order = ["name", "source_version", "guidelines", "required_reviews", "reviewers"]

    name = forms.CharField(max_length=100)
    source_version = forms.ModelChoiceField(queryset=None, label="Preference dataset version",
                                            help_text="Every row becomes an item to review.",
                                            error_messages={"required": "Choose the preference dataset version to review."})

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, project=project, **kwargs)
        self.fields["source_version"].queryset = (
            DatasetVersion.objects.filter(dataset__project=project, dataset__kind="preference",
                                          status=VersionStatus.READY)
            .select_related("dataset").order_by("dataset__name", "-number"))
        self.fields["source_version"].label_from_instance = (
            lambda version: f"{isolated(version.dataset.name)} v{version.number} "
                            f"({counted(version.row_count, 'row', grouped=True)})")


# A generated campaign's chat template variables, as the chat panel's but for two models.
_VARIABLE_CHECKED = (f"The first {TEMPLATE_CHECKED_PROMPTS:,} prompts (all, for fewer) are rendered with it as the "
                     "campaign is created; a prompt the template fails on is named by its row.")
VARIABLE_HELP = ("Read by the chat template of model A or B: every prompt is rendered with it for the model whose "
                 "template reads it, as the chat panel's. Empty: not sent (the model's own value). " + _VARIABLE_CHECKED)
VARIABLE_SWITCH_HELP = ("Read by the chat template of model A or B as a switch: every prompt is rendered with it for the "
                        "model whose template reads it, as the chat panel's. Not sent: the model's own value. "
                        + _VARIABLE_CHECKED)


class GeneratedCampaignForm(CampaignSettingsForm):
    """A campaign on two models' answers to the same prompts (``services.campaign_generate``)."""

    field_order = ["name", "model_a", "model_b", "prompts_version", "prompt_count", "max_new_tokens", "temperature",
                   "top_p", "top_k", "seed", "thinking", "guidelines", "required_reviews", "reviewers"]

    name = forms.CharField(max_length=100)
    model_a = ModelRefField(label="Model A", help_text="A base model, a succeeded run or one of its checkpoints.",
                                error_messages={"required": "Choose the model that answers as A."})
    model_b = ModelRefField(label="Model B", error_messages={"required": "Choose the model that answers as B."})
    prompts_version = forms.ChoiceField(
        label="Prompts", help_text=(f"A run's eval set, or a prompts or sft dataset. The first "
                                    f"{TEMPLATE_CHECKED_PROMPTS:,} prompts used are rendered with each model's chat "
                                    "template as the campaign is created; one a template refuses is named by its row."),
        error_messages={"required": "Choose the prompts both models answer."})
    prompt_count = forms.IntegerField(min_value=1, max_value=MAX_GENERATED_PROMPTS, initial=100, label="Prompts to use",
                                      help_text="The first rows of the dataset.")
    max_new_tokens = forms.IntegerField(min_value=1, max_value=4096, initial=256, label="Max new tokens")
    temperature = forms.FloatField(min_value=0, max_value=5, initial=0.7, help_text="0 = greedy.")
    top_p = forms.FloatField(min_value=0.01, max_value=1, initial=1.0, label="Top-p")
    top_k = forms.IntegerField(min_value=0, max_value=1000, initial=0, label="Top-k", help_text="0 = off.")
    seed = forms.IntegerField(min_value=0, max_value=2**31 - 1, initial=0)
    thinking = forms.TypedChoiceField(
        choices=THINKING_CHOICES, coerce=thinking_choice, empty_value=None, required=False, help_text=THINKING_HELP,
        error_messages={"invalid_choice": "%(value)s is not a Thinking choice; choose on, off or each model's default."})

    def __init__(self, *args, project: Project, **kwargs):
        super().__init__(*args, project=project, **kwargs)
        choices = model_choices(project=project)
        models = [(choice.ref, choice.option_label) for choice in choices]
        self.fields["model_a"].choices = models
        self.fields["model_b"].choices = models
        if not thinking_defaults(choices):  # as the chat's switch: only where a model of the project reads it
            del self.fields["thinking"]
        sources = prompt_sources(project=project)
        self.sources = {version.public_id: version for version, _label in sources}
        self.fields["prompts_version"].choices = [(version.public_id, label) for version, label in sources]
        variables = self._add_variables(choices)
        order = list(self.field_order)
        self.order_fields(order[:order.index("seed") + 2] + variables + order[order.index("seed") + 2:])

    def _add_variables(self, choices) -> list[str]:
        """A field ``var_<name>`` for each chat template variable a model of the project reads, as the arena's compare
        mode offers them (the chat panel's ``template_variable_field``: a switch's is a select): ``data-template-variable`` lists the models reading it, by which forms.js shows and enables
        it where model A's or B's template reads it and hides and disables it otherwise (so as served, for the models
        sent or the first one). Returns the fields' names."""
        readers: dict[str, dict[str, TemplateVariable]] = {}
        for choice in choices:
            for name, variable in chat_template_variables(choice).items():
                readers.setdefault(name, {})[choice.ref] = variable
        picked = ({self.data.get("model_a"), self.data.get("model_b")} if self.is_bound
                  else {choices[0].ref} if choices else set())
        names = []
        for name, variables in sorted(readers.items()):
            field = template_variable_field(name=name, readers=variables.values(), help_text=VARIABLE_HELP,
                                            switch_help_text=VARIABLE_SWITCH_HELP)
            field.widget.attrs["data-template-variable"] = json.dumps({ref: "" for ref in variables})
            field.initially_hidden = not picked & set(variables)
            if field.initially_hidden:
                field.widget.attrs["disabled"] = True
            self.fields[f"{VARIABLE_PREFIX}{name}"] = field
            names.append(f"{VARIABLE_PREFIX}{name}")
        return names

    def template_variables(self) -> dict[str, str]:
        """The chat template variables typed, by name (an empty box is not sent)."""
        return {name[len(VARIABLE_PREFIX):]: value for name, value in self.cleaned_data.items()
                if name.startswith(VARIABLE_PREFIX) and value != ""}

    def clean_prompts_version(self):
        return self.sources[self.cleaned_data["prompts_version"]]


class ReviewForm(forms.Form):
    item = forms.CharField(widget=forms.HiddenInput)
    choice = forms.ChoiceField(choices=Choice.choices)
    edited_first = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    edited_second = forms.CharField(required=False, strip=False, widget=forms.Textarea)
    comment = TypedTextField(required=False, max_length=5000, widget=forms.Textarea(attrs={"rows": 2}))


RESOLUTION_CHOICES = [(label.value, label.label) for label in Label if label != Label.SKIP]


class ResolveForm(forms.Form):
    label = forms.ChoiceField(choices=RESOLUTION_CHOICES)
    # The resolution the page showed ("" for none): one made since is not overwritten unasked. A page
    # from before this field existed sends nothing, which reads as none.
    shown_label = forms.ChoiceField(choices=[("", "none"), *RESOLUTION_CHOICES], required=False)
    # And that resolution's stamp (``services.resolution_stamp``: its label and final texts), so that a text changed
    # since under the same label is not overwritten unseen either. Not sent (scripts, older pages): the label alone.
    shown_resolution = forms.CharField(required=False, max_length=64)
    # Sent by the page asking to confirm a change of resolution: a refusal of its texts draws that page again.
    confirming = forms.BooleanField(required=False)
    # The final text of response a/b where reviewers' edits of it differ: ``pick_*`` one of the texts offered (an
    # edit, or the original), ``""`` or none to take ``text_*``, the text the owner wrote.
    pick_a = forms.CharField(required=False, strip=False)
    pick_b = forms.CharField(required=False, strip=False)
    text_a = forms.CharField(required=False, strip=False)
    text_b = forms.CharField(required=False, strip=False)

    def final_texts(self) -> dict[str, str | None]:
        """The final text sent for each response: the one picked, else the one written ("" for a box left empty);
        None where the form offered none (neither a text picked nor a box sent)."""
        data = self.cleaned_data
        return {side: data[f"pick_{side}"] or data[f"text_{side}"]
                if data[f"pick_{side}"] or f"text_{side}" in self.data else None for side in ("a", "b")}


class ExportForm(forms.Form):
    dataset_name = forms.CharField(max_length=100, label="Dataset",
                                   help_text="A new preference dataset, or an existing one to add a version to.")
    drop_ties = forms.BooleanField(required=False, initial=True, label="Leave out ties")
    drop_both_bad = forms.BooleanField(required=False, initial=True, label="Leave out both-bad items")
    apply_edits = forms.BooleanField(
        required=False, initial=True, label="Use reviewers' edited responses",
        help_text="Unticked, the original responses are written, except where an owner resolving a conflict chose or "
                  "wrote a response's final text: that text is always written.")
