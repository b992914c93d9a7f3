"""The migrations that make base model and dataset names unique in any letter case: rows that differed only
in case before keep their data; the later ones get a numbered name, and the constraint is then added. First
on LOWER(name), then on the stored name_key (Python's casefold, which LOWER is not outside ASCII)."""
import pytest

from tests.webapp.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)

BEFORE = [("basemodels", "0002_tokenizer_vocab_size"), ("datasets", "0001_initial")]


def test_names_differing_only_in_case_get_numbered_and_the_constraint_is_added():
    with migrated_back_to(*BEFORE) as apps:
        Project = apps.get_model("projects", "Project")
        BaseModel = apps.get_model("basemodels", "BaseModel")
        Dataset = apps.get_model("datasets", "Dataset")
        alpha = Project.objects.create(name="Alpha", slug="alpha")
        beta = Project.objects.create(name="Beta", slug="beta")
        model_fields = dict(architecture="x", parameter_count=1, tokenizer_type="x", dtype="x", size_bytes=1)
        for index, name in enumerate(["demo", "Demo", "DEMO", "demo (2)"]):
            BaseModel.objects.create(project=alpha, name=name, path=f"/m/{index}", **model_fields)
        BaseModel.objects.create(project=beta, name="DEMO", path="/m/beta", **model_fields)
        long_name = "x" * 100
        for name in [long_name, long_name.upper(), "Chats", "chats"]:
            Dataset.objects.create(project=alpha, name=name, kind="sft")
    from webapp.basemodels.models import BaseModel as CurrentBaseModel
    from webapp.datasets.models import Dataset as CurrentDataset

    assert list(CurrentBaseModel.objects.filter(project__slug="alpha").order_by("pk").values_list("name", flat=True)) == [
        "demo", "Demo (3)", "DEMO (4)", "demo (2)"]
    assert CurrentBaseModel.objects.get(project__slug="beta").name == "DEMO"
    assert list(CurrentDataset.objects.order_by("pk").values_list("name", flat=True)) == [
        "x" * 100, "X" * 96 + " (2)", "Chats", "chats (2)"]


LOWER_CONSTRAINTS = [("basemodels", "0004_unique_name_in_any_case"), ("datasets", "0003_unique_name_in_any_case")]


def test_names_one_only_when_case_folded_get_numbered_and_keyed():
    """Pairs that no database's LOWER makes one (ß folds to "ss", the ligature ﬁ to "fi"), so that the LOWER
    constraint of the migrations before lets them in on SQLite and on PostgreSQL alike."""
    with migrated_back_to(*LOWER_CONSTRAINTS) as apps:
        Project = apps.get_model("projects", "Project")
        BaseModel = apps.get_model("basemodels", "BaseModel")
        Dataset = apps.get_model("datasets", "Dataset")
        alpha = Project.objects.create(name="Alpha", slug="alpha")
        beta = Project.objects.create(name="Beta", slug="beta")
        model_fields = dict(architecture="x", parameter_count=1, tokenizer_type="x", dtype="x", size_bytes=1)
        for index, name in enumerate(["ﬁle", "FILE", "file (2)"]):
            BaseModel.objects.create(project=alpha, name=name, path=f"/m/{index}", **model_fields)
        BaseModel.objects.create(project=beta, name="FILE", path="/m/beta", **model_fields)
        for name in ["Straße", "STRASSE", "STRASSE (2)", "ß" * 50, "S" * 100]:
            Dataset.objects.create(project=alpha, name=name, kind="sft")
    from webapp.basemodels.models import BaseModel as CurrentBaseModel
    from webapp.core.name_case import name_key
    from webapp.datasets.models import Dataset as CurrentDataset

    assert list(CurrentBaseModel.objects.order_by("pk").values_list("name", flat=True)) == [
        "ﬁle", "FILE (3)", "file (2)", "FILE"]
    assert list(CurrentDataset.objects.order_by("pk").values_list("name", flat=True)) == [
        "Straße", "STRASSE (3)", "STRASSE (2)", "ß" * 50, "S" * 96 + " (2)"]
    for model in (CurrentBaseModel, CurrentDataset):
        assert all(row.name_key == name_key(row.name) for row in model.objects.all())


BEFORE_VISIBLE_NAMES = [("projects", "0001_initial"), ("basemodels", "0006_unique_name_key"),
                        ("datasets", "0005_unique_name_key"), ("runs", "0007_checkpoint_export"),
                        ("review", "0008_campaign_source_label")]


def test_invisible_characters_are_removed_from_names_stored_before_they_were_refused():
    """Names that ``checked_name`` refuses today (U+200B, U+202E, a BOM: category Cf) were stored before it; they
    lose those characters (and are put in NFC, stripped, as it stores them). Where that makes a name taken in
    the project (in any case for base models and datasets, exactly for campaigns), the name that was already
    clean keeps it and the cleaned one is numbered; a name of invisible characters only becomes the row's id."""
    from webapp.core.name_case import name_key

    with migrated_back_to(*BEFORE_VISIBLE_NAMES) as apps:
        Project = apps.get_model("projects", "Project")
        BaseModel = apps.get_model("basemodels", "BaseModel")
        Dataset = apps.get_model("datasets", "Dataset")
        Run = apps.get_model("runs", "Run")
        Campaign = apps.get_model("review", "Campaign")
        alpha = Project.objects.create(name="Alpha\u200b", slug="alpha")
        beta = Project.objects.create(name="\u202e\u200b", slug="beta")
        model_fields = dict(architecture="x", parameter_count=1, tokenizer_type="x", dtype="x", size_bytes=1)
        for index, name in enumerate(["tiny\ufeff", "TINY"]):
            BaseModel.objects.create(project=alpha, name=name, name_key=name_key(name), path=f"/m/{index}",
                                     **model_fields)
        for project, name in [(alpha, "\u200bchats"), (alpha, "Chats"), (alpha, "qa3-sft"), (alpha, "qa3-sft\u200b"),
                              (alpha, " cafe\u0301\u200b"), (beta, "qa3-sft\u200b")]:
            Dataset.objects.create(project=project, name=name, name_key=name_key(name), kind="sft")
        for name in ["helpfulness", "helpfulness\u202e", "\u200b"]:
            Campaign.objects.create(project=alpha, name=name)
        for name in ["run\u200b-1", "run-1", ""]:
            Run.objects.create(project=alpha, name=name, task="sft", spec={}, resolved_spec={})
    from webapp.basemodels.models import BaseModel as CurrentBaseModel
    from webapp.datasets.models import Dataset as CurrentDataset
    from webapp.projects.models import Project as CurrentProject
    from webapp.review.models import Campaign as CurrentCampaign
    from webapp.runs.models import Run as CurrentRun

    def names(model):
        return list(model.objects.order_by("pk").values_list("name", flat=True))

    assert names(CurrentProject) == ["Alpha", "beta"]
    assert names(CurrentBaseModel) == ["tiny (2)", "TINY"]
    assert names(CurrentDataset) == ["chats (2)", "Chats", "qa3-sft", "qa3-sft (2)", "caf\u00e9", "qa3-sft"]
    campaigns = list(CurrentCampaign.objects.order_by("pk"))
    assert [campaign.name for campaign in campaigns] == ["helpfulness", "helpfulness (2)", campaigns[2].public_id]
    assert names(CurrentRun) == ["run-1", "run-1", ""]  # run names need not be unique; a blank one stays blank
    for model in (CurrentBaseModel, CurrentDataset):
        assert all(row.name_key == name_key(row.name) for row in model.objects.all())
