"""Datasets migrations that bring older rows in line with what the services now do."""
import pytest

from tests.webapp.migrating import migrated_back_to

pytestmark = pytest.mark.django_db(transaction=True)


def a_dataset_of_then(apps):
    """The version model of the migrated-back state ``apps``, and a chat dataset of a new project made with it."""
    Project = apps.get_model("projects", "Project")
    Dataset = apps.get_model("datasets", "Dataset")
    project = Project.objects.create(name="alpha", slug="alpha")
    dataset = Dataset.objects.create(project=project, name="chats", name_key="chats", kind="sft")
    return apps.get_model("datasets", "DatasetVersion"), dataset


def test_file_names_stored_before_they_were_checked_as_names_lose_invisible_characters():
    """'report' + U+202E + 'lsx.csv' showed as 'reportvsc.xsl': stored names lose such characters and are put in
    NFC, as ``dataset_version_create`` stores them now; one of invisible characters only becomes 'upload'."""
    with migrated_back_to(("datasets", "0007_last_version_number")) as apps:
        DatasetVersion, dataset = a_dataset_of_then(apps)
        for number, filename in enumerate(("report\u202elsx.csv", "cafe\u0301.jsonl", "\u200b", "chats.jsonl"), 1):
            DatasetVersion.objects.create(public_id=f"dv_{number}", dataset=dataset, number=number, file_path="x",
                                          original_filename=filename, format="jsonl", size_bytes=1)
    from webapp.datasets.models import DatasetVersion as CurrentVersion

    assert dict(CurrentVersion.objects.values_list("public_id", "original_filename")) == {
        "dv_1": "reportlsx.csv", "dv_2": "caf\u00e9.jsonl", "dv_3": "upload", "dv_4": "chats.jsonl"}


def test_the_note_that_a_checks_worker_was_lost_moves_from_the_errors_to_the_notice_and_back():
    """The note that a check's worker was lost and the check started over was the one item of a version's
    ``errors``, where an API client that reads any error as failure misread it: a version still being checked has
    it as its ``notice`` instead; a settled version's errors stay as they were. Migrated back, the notice is that
    item of its errors again (it was dropped with the column)."""
    note = {"code": "worker_lost_requeued", "message": "the worker checking this file (w1) was lost",
            "line": None, "row": None, "field": None}
    problem = {"code": "bad_json", "message": "not JSON", "line": 3, "row": 3, "field": None}
    with migrated_back_to(("datasets", "0008_visible_filenames")) as apps:
        DatasetVersion, dataset = a_dataset_of_then(apps)
        for number, (status, errors) in enumerate((("validating", [note]), ("uploaded", [note]),
                                                   ("failed", [problem]), ("ready", [])), 1):
            DatasetVersion.objects.create(public_id=f"dv_{number}", dataset=dataset, number=number, file_path="x",
                                          original_filename="chats.jsonl", format="jsonl", size_bytes=1,
                                          status=status, errors=errors, error_count=len(errors) * (status == "failed"))
    from webapp.datasets.models import DatasetVersion as CurrentVersion

    assert {public_id: (errors, notice) for public_id, errors, notice
            in CurrentVersion.objects.values_list("public_id", "errors", "notice")} == {
        "dv_1": ([], note["message"]), "dv_2": ([], note["message"]), "dv_3": ([problem], ""), "dv_4": ([], "")}
    with migrated_back_to(("datasets", "0008_visible_filenames")) as apps:
        assert dict(apps.get_model("datasets", "DatasetVersion").objects.values_list("public_id", "errors")) == {
            "dv_1": [note], "dv_2": [note], "dv_3": [problem], "dv_4": []}


def test_a_split_record_becomes_a_derivation_of_kind_split_and_back():
    """``DatasetVersion.split`` became ``derivation``, whose records name their kind: a version split before says
    "split"; migrated back, a split's record loses its kind and a dedupe's, which a split's column cannot say, is
    dropped (the version reads as an upload)."""
    split = {"source": "dv_0", "dataset": "ds_0", "dataset_name": "qa", "number": 1, "side": "train",
             "partner": "dv_9", "fraction": 0.1, "count": None, "held_out_rows": 4, "seed": 0, "stratify": ""}
    with migrated_back_to(("datasets", "0011_dsplit")) as apps:
        DatasetVersion, dataset = a_dataset_of_then(apps)
        for number, record in enumerate((split, {}), 1):
            DatasetVersion.objects.create(public_id=f"dv_{number}", dataset=dataset, number=number, file_path="x",
                                          original_filename="chats.jsonl", format="jsonl", size_bytes=1,
                                          split=record)
    from webapp.datasets.models import DatasetVersion as CurrentVersion

    assert dict(CurrentVersion.objects.values_list("public_id", "derivation")) == {
        "dv_1": {"kind": "split", **split}, "dv_2": {}}
    CurrentVersion.objects.filter(public_id="dv_2").update(derivation={
        "kind": "dedupe", "source": "dv_1", "dataset": "ds_0", "dataset_name": "qa", "number": 1, "removed_rows": 3})
    with migrated_back_to(("datasets", "0011_dsplit")) as apps:
        assert dict(apps.get_model("datasets", "DatasetVersion").objects.values_list("public_id", "split")) == {
            "dv_1": split, "dv_2": {}}
