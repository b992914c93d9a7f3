"""Splitting a ready version into a training and a held-out dataset: the assignment of rows to sides
(``splitting.split_assignment``, worked out by hand on small inputs), the held-out size as typed, the service that
asks for a split (each refusal on its field, nothing saved) and the worker's side that writes the files, the pages
and the REST API. Then the other derivations, new versions of the same dataset written through the same path: the
version without its exact repeats and the version without the rows another version holds (rows kept worked out by
hand), their refusals, pages, the launch warnings' links to them, and the REST API."""
import collections
import csv
import io
import json
import re

import numpy as np
import pytest
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from webapp.activity.models import Activity, Verb
from jaxengine.data import formats
from webapp.api.services import token_create
from webapp.core.warnings import warning_action
from webapp.datasets import derivations, selectors, services, splitting
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.workers.deliveries import LostWorker


@pytest.fixture(autouse=True)
def sent(monkeypatch) -> list[tuple[str, list]]:
    """The tasks the services queued, in order (no broker in these tests: the worker's side is called by hand), each
    at once rather than once its transaction commits (a test's transaction never does)."""
    queued = []
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue: queued.append((name, args)))
    monkeypatch.setattr(services, "_enqueue", lambda name, *args: services._send(name, list(args)))
    return queued


@pytest.fixture(autouse=True)
def fresh_cache():
    selectors._shared_rows.cache_clear()
    yield
    selectors._shared_rows.cache_clear()


def jsonl(rows: list[dict]) -> bytes:
    return "".join(json.dumps(row) + "\n" for row in rows).encode()


def upload(team, content: bytes, *, name="qa", kind="sft", filename="rows.jsonl", mapping=None, validate=True):
    version = services.dataset_create_with_upload(project=team.project, name=name, kind=kind, file_format=None,
                                                  upload=SimpleUploadedFile(filename, content),
                                                  column_mapping=mapping or {}, user=team.teammate)
    if validate:
        version = services.dataset_version_validate(version_id=version.pk)
        assert version.status == VersionStatus.READY, version.errors
    return version


def labelled_rows() -> list[dict]:
    """40 rows: 30 of task "chat" and 10 of task "math"; the chat rows 1 and 2 each repeated twice more."""
    rows = [{"question": f"chat question {number}", "answer": f"chat answer {number}", "task": "chat"}
            for number in range(1, 27)]
    rows += [dict(rows[0]), dict(rows[0]), dict(rows[1]), dict(rows[1])]
    rows += [{"question": f"sum {number}", "answer": str(number), "task": "math"} for number in range(10)]
    return rows


MAPPING = {"prompt": "question", "completion": "answer"}


def write_split(sent) -> list[DatasetVersion]:
    """Run the queued split as the worker would, then the checks it queued; the two sides as they end."""
    (name, (train_id, held_out_id)), = [task for task in sent if task[0] == services.DERIVE_TASK]
    sent.clear()
    services.dataset_derivation_write(version_ids=[train_id, held_out_id])
    for name, (version_id,) in sent:
        assert name == services.VALIDATE_TASK
        services.dataset_version_validate(version_id=version_id)
    return [DatasetVersion.objects.select_related("dataset").get(pk=pk) for pk in (train_id, held_out_id)]


def file_rows(version: DatasetVersion) -> list[dict]:
    return [json.loads(line) for line in version.absolute_path.read_text().splitlines()]


class TestHeldOutSize:
    @pytest.mark.parametrize(("typed", "fraction", "count"), [
        ("0.1", 0.1, None), ("10%", 0.1, None), (" 12.5% ", 0.125, None), ("500", None, 500), (0.25, 0.25, None),
        (3, None, 3), ("1", None, 1)])
    def test_it_reads_a_fraction_or_a_count(self, typed, fraction, count):
        assert splitting.held_out_size(typed) == splitting.HeldOutSize(fraction=fraction, count=count)

    @pytest.mark.parametrize("typed", ["0", "1.0", "1.5", "100%", "0%", "-0.1", "abc", "", None, True, 0, -3, 2.0,
                                       "nan"])
    def test_it_rejects_what_is_no_size(self, typed):
        with pytest.raises(splitting.SplitError, match="0.1"):  # each refusal gives an example of what to type
            splitting.held_out_size(typed)

    def test_rows_round_a_fraction_to_the_nearest_row_and_leave_both_sides_rows(self):
        assert splitting.HeldOutSize(fraction=0.1).rows(25) == 3  # 2.5 rounds up
        assert splitting.HeldOutSize(fraction=0.1).rows(24) == 2  # 2.4
        assert splitting.HeldOutSize(count=9).rows(10) == 9
        with pytest.raises(splitting.SplitError, match="no row"):
            splitting.HeldOutSize(fraction=0.01).rows(20)  # 0.2 of a row
        with pytest.raises(splitting.SplitError, match="leaves none to train on"):
            splitting.HeldOutSize(fraction=0.99).rows(20)  # 19.8: every row
        with pytest.raises(splitting.SplitError, match="not fewer than"):
            splitting.HeldOutSize(count=10).rows(10)


class TestSplitAssignment:
    def test_it_holds_out_exactly_the_rows_asked_for_and_is_deterministic(self):
        digests = np.arange(100, 120, dtype=np.uint64)
        held = splitting.split_assignment(digests, held_out=5, seed=0)
        assert held.dtype == bool and len(held) == 20 and held.sum() == 5
        assert splitting.split_assignment(digests, held_out=5, seed=0).tolist() == held.tolist()
        others = [splitting.split_assignment(digests, held_out=5, seed=seed).tolist() for seed in (1, 2, 3)]
        assert any(other != held.tolist() for other in others)  # a seed draws its own rows

    def test_it_does_not_depend_on_the_order_of_the_rows(self):
        """The same rows in another order hold out the same rows: groups are drawn by digest, not by place."""
        digests = np.array([7, 3, 9, 1, 5, 11, 13, 2], dtype=np.uint64)
        held = splitting.split_assignment(digests, held_out=3, seed=4)
        reversed_held = splitting.split_assignment(digests[::-1].copy(), held_out=3, seed=4)
        assert set(digests[held].tolist()) == set(digests[::-1][reversed_held].tolist())

    def test_duplicates_go_to_the_same_side(self):
        # Rows 1, 4 and 7 are one row (digest 5), rows 2 and 8 another (digest 6).
        digests = np.array([5, 6, 1, 5, 2, 3, 5, 6, 4, 8], dtype=np.uint64)
        for seed in range(40):
            held = splitting.split_assignment(digests, held_out=3, seed=seed)
            assert len({bool(held[row]) for row in (0, 3, 6)}) == 1
            assert held[1] == held[7]
            assert held.sum() == 3  # the three copies, or two and one, or three distinct rows: 3 fits each way
            assert not set(digests[held].tolist()) & set(digests[~held].tolist())

    def test_a_group_too_big_for_what_is_left_is_passed_over_for_smaller_ones(self):
        # Digest 1 is 4 rows; holding out 2, it never fits: two of the single rows are held out whatever the seed.
        digests = np.array([1, 1, 1, 1, 2, 3, 4], dtype=np.uint64)
        for seed in range(20):
            held = splitting.split_assignment(digests, held_out=2, seed=seed)
            assert held.tolist()[:4] == [False] * 4 and held.sum() == 2

    def test_each_label_holds_out_its_share(self):
        # 10 rows of label 0, 10 of label 1, 5 of label 2; 5 held out: 2, 2 and 1.
        labels = [0] * 10 + [1] * 10 + [2] * 5
        digests = np.arange(25, dtype=np.uint64)
        for seed in range(10):
            held = splitting.split_assignment(digests, held_out=5, seed=seed, labels=labels)
            assert collections.Counter(np.asarray(labels)[held].tolist()) == {0: 2, 1: 2, 2: 1}

    def test_left_over_rows_go_to_the_largest_remainders(self):
        # 6, 3 and 1 rows, 5 held out: exact shares 3, 1.5 and 0.5; 3 and 1 rounded down, the row left over to one
        # of the two tied halves. 90 rows and 10, 10% held out: 9 and 1 (the rare label keeps a held-out row).
        labels = [0] * 6 + [1] * 3 + [2]
        seen = set()
        for seed in range(30):
            counts = collections.Counter(np.asarray(labels)[
                splitting.split_assignment(np.arange(10, dtype=np.uint64), held_out=5, seed=seed, labels=labels)])
            assert counts[0] == 3 and counts[1] + counts[2] == 2 and counts[1] in (1, 2)
            seen.add(counts[1])
        assert seen == {1, 2}  # the tie is broken by the seed, not always the same way
        labels = [0] * 90 + [1] * 10
        held = splitting.split_assignment(np.arange(100, dtype=np.uint64), held_out=10, seed=0, labels=labels)
        assert collections.Counter(np.asarray(labels)[held].tolist()) == {0: 9, 1: 1}

    def test_it_refuses_a_split_that_leaves_a_side_empty(self):
        with pytest.raises(splitting.SplitError, match="copies of 1 distinct row"):
            splitting.split_assignment(np.array([4, 4, 4, 4], dtype=np.uint64), held_out=1, seed=0)
        with pytest.raises(splitting.SplitError, match="hold out at least one"):
            splitting.split_assignment(np.arange(4, dtype=np.uint64), held_out=4, seed=0)


class TestSplit:
    def test_it_works(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        train, held = services.dataset_version_split(version=source, held_out="0.25", seed=0, stratify="task",
                                                     user=team.teammate)
        assert (train.dataset.name, held.dataset.name) == ("qa train", "qa held-out")
        assert train.status == held.status == VersionStatus.UPLOADED and not train.absolute_path.exists()
        train, held = write_split(sent)
        assert train.status == held.status == VersionStatus.READY, (train.errors, held.errors)
        assert (train.row_count, held.row_count) == (30, 10)
        assert train.column_mapping == held.column_mapping == MAPPING and train.format == "jsonl"
        # Stratified: 30 chat rows and 10 math rows, a quarter of each held out.
        assert collections.Counter(row["task"] for row in file_rows(held)) == {"chat": 7, "math": 3} or \
            collections.Counter(row["task"] for row in file_rows(held)) == {"chat": 8, "math": 2}
        # Every source row on one side, as it was.
        source_rows = sorted(map(json.dumps, labelled_rows()))
        assert sorted(map(json.dumps, file_rows(train) + file_rows(held))) == source_rows
        # The sides share no row, so a launch on them is not warned of an overlap (it is, on the source and a side).
        train_digests, held_digests = (selectors.version_row_digests(version=side) for side in (train, held))
        assert not set(train_digests.tolist()) & set(held_digests.tolist())
        assert not [warning for warning in selectors.launch_warnings(task="sft", train=train, evaluation=held)
                    if "shares" in warning]
        assert [warning for warning in selectors.launch_warnings(task="sft", train=source, evaluation=held)
                if "shares" in warning]

    def test_it_records_where_each_side_came_from(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        services.dataset_about_update(dataset=source.dataset, user=team.owner, licence="cc-by-4.0",
                                      source="https://example.org/qa")
        train, held = services.dataset_version_split(version=source, held_out=4, seed=7, user=team.teammate,
                                                     train_name="qa-fit", held_out_name="qa-eval")
        assert held.derivation == {"kind": "split", "source": source.public_id, "dataset": source.dataset.public_id,
                                   "dataset_name": "qa", "number": 1, "side": "held_out", "partner": train.public_id,
                                   "fraction": None, "count": 4, "held_out_rows": 4, "seed": 7, "stratify": ""}
        assert train.derivation["side"] == "train" and train.derivation["partner"] == held.public_id
        assert selectors.derivation_phrase(held.derivation) == (
            "Split from qa v1, seed 7, 4 rows held out: the held-out side")
        assert selectors.derivation_phrase(services.dataset_version_split(
            version=source, held_out="10%", seed=0, stratify="task", user=team.teammate)[0].derivation) == (
            "Split from qa v1, seed 0, 10% held out, stratified by task: the training side")
        for side in (train, held):
            side.dataset.refresh_from_db()
            assert (side.dataset.licence, side.dataset.source) == ("cc-by-4.0", "https://example.org/qa")
        entry = Activity.objects.filter(verb=Verb.DATASET_VERSION_SPLIT, target_id=source.public_id).earliest("pk")
        assert entry.actor == team.teammate
        assert entry.details["train"] == "qa-fit v1" and entry.details["held_out"] == "qa-eval v1 (4 rows)"

    def test_the_same_seed_splits_the_same_way_again(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        services.dataset_version_split(version=source, held_out=0.2, seed=3, user=team.teammate)
        _train, first = write_split(sent)
        services.dataset_version_split(version=source, held_out=0.2, seed=3, user=team.teammate,
                                       train_name="again train", held_out_name="again held-out")
        _train, second = write_split(sent)
        assert file_rows(first) == file_rows(second)

    def test_a_csv_version_splits_into_csv_files_read_as_its_rows_are(self, team, sent):
        text = io.StringIO()
        writer = csv.writer(text)
        writer.writerow(["question", "answer", "task"])
        writer.writerows([[f"q{n}, with a comma", f"line one\nline {n}", "a" if n % 2 else "b"] for n in range(12)])
        source = upload(team, text.getvalue().encode(), filename="rows.csv", mapping=MAPPING)
        services.dataset_version_split(version=source, held_out="3", seed=0, stratify="task", user=team.teammate)
        train, held = write_split(sent)
        assert (train.format, held.format, train.original_filename) == ("csv", "csv", "rows-train.csv")
        assert (train.row_count, held.row_count) == (9, 3)
        source_digests = selectors.version_row_digests(version=source).tolist()
        assert sorted(selectors.version_row_digests(version=train).tolist()
                      + selectors.version_row_digests(version=held).tolist()) == sorted(source_digests)

    @pytest.mark.parametrize(("arguments", "field", "words"), [
        ({"held_out": "1.5"}, "held_out", "not a fraction between 0 and 1"),
        ({"held_out": 40}, "held_out", "not fewer than the version's 40"),
        ({"held_out": "0.1", "stratify": "topic"}, "stratify", "has no column 'topic'"),
        ({"held_out": "0.1", "seed": -1}, "seed", "whole number from 0"),
        ({"held_out": "0.1", "train_name": "qa"}, "train_name", "already has a dataset named 'qa'"),
        ({"held_out": "0.1", "held_out_name": "QA"}, "held_out_name", "already has a dataset named 'qa'"),
        ({"held_out": "0.1", "train_name": "same", "held_out_name": "Same"}, "held_out_name", "different names"),
    ])
    def test_it_rejects_bad_input_on_its_field_and_saves_nothing(self, team, sent, arguments, field, words):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        sent.clear()
        datasets, versions, entries = Dataset.objects.count(), DatasetVersion.objects.count(), Activity.objects.count()
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_split(version=source, user=team.teammate, **arguments)
        assert list(refused.value.message_dict) == [field]
        assert words in refused.value.message_dict[field][0]
        assert (Dataset.objects.count(), DatasetVersion.objects.count(), Activity.objects.count()) == (
            datasets, versions, entries)
        assert not sent

    def test_it_names_every_field_wrong_at_once(self, team):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_split(version=source, held_out="x", seed=-2, stratify="nope", train_name="qa",
                                           user=team.teammate)
        assert set(refused.value.message_dict) == {"held_out", "seed", "stratify", "train_name"}

    def test_it_rejects_a_version_not_ready(self, team, sent):
        waiting = upload(team, jsonl(labelled_rows()), mapping=MAPPING, validate=False)
        sent.clear()
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_split(version=waiting, held_out="0.1", user=team.teammate)
        assert "only a ready version can be split; wait for its check" in refused.value.message_dict["version"][0]
        assert Dataset.objects.count() == 1 and not sent

    def test_a_split_that_cannot_be_made_fails_both_sides_saying_why(self, team, sent):
        source = upload(team, jsonl([{"prompt": "same", "completion": "row"}] * 4))
        services.dataset_version_split(version=source, held_out=2, seed=0, user=team.teammate)
        train, held = write_split(sent)
        assert train.status == held.status == VersionStatus.FAILED
        assert held.errors[0]["code"] == "split_failed"
        assert "the 4 rows are copies of 1 distinct row, which" in held.errors[0]["message"]
        assert not train.absolute_path.exists() and not held.absolute_path.exists()

    def test_a_column_of_too_many_values_to_stratify_by_fails_both_sides(self, team, sent, monkeypatch):
        """Where its first rows hold few values, the request lets it through: the worker reads every row."""
        monkeypatch.setattr(splitting, "MAX_STRATA", 3)
        monkeypatch.setattr(splitting, "STRATA_CHECKED_ROWS", 3)
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        services.dataset_version_split(version=source, held_out="0.1", stratify="answer", user=team.teammate)
        train, held = write_split(sent)
        assert train.status == held.status == VersionStatus.FAILED
        assert "column 'answer' holds more than 3 different values" in train.errors[0]["message"]

    def test_a_column_of_too_many_values_in_its_first_rows_is_refused_on_its_field(self, team, sent, monkeypatch):
        """Its first ``STRATA_CHECKED_ROWS`` rows read in the request: a column of ids is refused before anything is
        saved or queued, beside the field, and reading stops at the value past ``MAX_STRATA``."""
        monkeypatch.setattr(splitting, "MAX_STRATA", 3)
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        sent.clear()
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_split(version=source, held_out="0.1", stratify="answer", user=team.teammate)
        assert refused.value.message_dict == {"stratify": [
            "column 'answer' holds more than 3 different values, too many to stratify by: choose a short label column "
            "such as task or source, or none"]}
        assert Dataset.objects.count() == 1 and not sent
        read = []
        rows = formats.iter_rows

        def counted_rows(*args, **kwargs):
            for item in rows(*args, **kwargs):
                read.append(item)
                yield item
        monkeypatch.setattr(formats, "iter_rows", counted_rows)
        with pytest.raises(splitting.SplitError):
            splitting.check_strata(source.absolute_path, fmt=formats.FileFormat.JSONL, column="answer")
        assert len(read) == 4  # the fourth value was one too many
        read.clear()
        splitting.check_strata(source.absolute_path, fmt=formats.FileFormat.JSONL, column="task")
        assert len(read) == 40  # two values: every row of these few read
        monkeypatch.setattr(splitting, "STRATA_CHECKED_ROWS", 5)
        read.clear()
        splitting.check_strata(source.absolute_path, fmt=formats.FileFormat.JSONL, column="task")
        assert len(read) == 5

    def test_the_source_cannot_be_deleted_while_it_is_split_and_can_be_after(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        services.dataset_version_split(version=source, held_out="0.1", user=team.teammate)
        with pytest.raises(ValidationError, match="is being split from"):
            services.dataset_version_delete(version=source)
        train, held = write_split(sent)
        services.dataset_version_delete(version=source)
        for side in (train, held):
            side.refresh_from_db()
            assert side.status == VersionStatus.READY and side.absolute_path.is_file()
            origin = selectors.derivation_origin(version=side)
            assert origin.source is None and origin.phrase.startswith("Split from qa v1")
        assert selectors.derivation_origin(version=held).partner == train

    def test_a_redelivered_split_writes_nothing_again_and_requeue_queues_the_split(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        train, held = services.dataset_version_split(version=source, held_out="0.1", user=team.teammate)
        sent.clear()
        services.dataset_version_requeue(version=held)  # no file yet: the split, not the check, is queued again
        assert sent == [(services.DERIVE_TASK, [train.pk, held.pk])]
        sent.clear()
        services.dataset_derivation_write(version_ids=[train.pk, held.pk])
        written = train.absolute_path.stat().st_mtime_ns
        sent.clear()
        assert services.dataset_derivation_write(version_ids=[train.pk, held.pk])
        assert train.absolute_path.stat().st_mtime_ns == written
        assert sent == [(services.VALIDATE_TASK, [train.pk]), (services.VALIDATE_TASK, [held.pk])]


    def test_a_lost_worker_is_said_on_both_sides_until_their_check_ends(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        train, held = services.dataset_version_split(version=source, held_out="0.1", user=team.teammate)
        lost = LostWorker(name="default@host", last_seen=None, delivered_at=timezone.now())
        assert services.derivation_requeued((train.pk, held.pk), lost=lost)
        held.refresh_from_db()
        assert held.notice.startswith("the worker splitting these rows (default@host")
        _train, held = write_split(sent)
        assert held.status == VersionStatus.READY and held.notice == ""
        assert not services.derivation_requeued((train.pk, held.pk), lost=lost)  # settled: nothing to say


class TestPages:
    def test_a_member_splits_a_version_from_its_page(self, team, client_for, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        client = client_for(team.teammate)
        page = reverse("datasets:version", args=[team.project.slug, source.dataset.public_id, 1])
        shown = client.get(page).content.decode()
        assert "Split into train and held-out" in shown and '<option value="task">task</option>' in shown
        response = client.post(reverse("datasets:split", args=[team.project.slug, source.dataset.public_id, 1]),
                               {"held_out": "10%", "seed": "0", "stratify": "task", "train_name": "qa train",
                                "held_out_name": "qa held-out"})
        train = Dataset.objects.get(name="qa train").versions.get()
        assert response.status_code == 302 and response.url == reverse(
            "datasets:version", args=[team.project.slug, train.dataset.public_id, 1])
        write_split(sent)
        shown = client.get(response.url).content.decode()
        assert "Split from qa v1, seed 0, 10% held out, stratified by task: the training side" in shown
        assert "qa held-out v1" in shown

    def test_a_side_not_yet_written_says_so_in_place_of_its_size(self, team, client_for, sent):
        """First-hour walk: both sides of a split read "qa-train.jsonl (jsonl, 0 bytes)" until the worker wrote them,
        as if the split had made empty files."""
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        client = client_for(team.teammate)
        response = client.post(reverse("datasets:split", args=[team.project.slug, source.dataset.public_id, 1]),
                               {"held_out": "10%", "seed": "0", "train_name": "qa train", "held_out_name": "qa held-out"})
        train = Dataset.objects.get(name="qa train")
        dataset_page = reverse("datasets:detail", args=[team.project.slug, train.public_id])
        for shown in (client.get(response.url).content.decode(), client.get(dataset_page).content.decode()):
            assert "being written by a worker" in shown and "0\xa0bytes" not in shown and "0 bytes" not in shown
        write_split(sent)
        for shown in (client.get(response.url).content.decode(), client.get(dataset_page).content.decode()):
            assert "being written by a worker" not in shown
            assert re.search(r"[0-9.]+\xa0(bytes|KB)", shown)  # its size, written

    def test_a_refusal_shows_the_form_again_beside_its_field(self, team, client_for, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        response = client_for(team.teammate).post(
            reverse("datasets:split", args=[team.project.slug, source.dataset.public_id, 1]),
            {"held_out": "2", "seed": "0", "stratify": "", "train_name": "qa", "held_out_name": "<b>x</b>"})
        assert response.status_code == 400
        shown = response.content.decode()
        assert "already has a dataset named" in shown and "split-version\" open" in shown
        assert "<b>x</b>" not in shown and Dataset.objects.count() == 1

    def test_a_stratify_column_of_ids_is_refused_beside_its_field(self, team, client_for, sent, monkeypatch):
        monkeypatch.setattr(splitting, "MAX_STRATA", 3)
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        response = client_for(team.teammate).post(
            reverse("datasets:split", args=[team.project.slug, source.dataset.public_id, 1]),
            {"held_out": "10%", "seed": "0", "stratify": "answer", "train_name": "qa train",
             "held_out_name": "qa held-out"})
        assert response.status_code == 400
        assert response.context["split_form"].errors["stratify"] == [
            "column 'answer' holds more than 3 different values, too many to stratify by: choose a short label "
            "column such as task or source, or none"]
        assert Dataset.objects.count() == 1

    def test_a_viewer_is_offered_no_split(self, team, client_for):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        page = reverse("datasets:version", args=[team.project.slug, source.dataset.public_id, 1])
        assert "Split into train" not in client_for(team.viewer).get(page).content.decode()


class TestApi:
    def test_it_splits_and_answers_both_versions(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        _token, secret = token_create(user=team.teammate, name="script")
        api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
        address = f"/api/v1/projects/{team.project.slug}/datasets/{source.dataset.public_id}/versions/1/split/"
        response = api.post(address, {"held_out": 0.25, "stratify": "task"}, content_type="application/json")
        assert response.status_code == 202, response.content
        body = response.json()
        assert body["train"]["status"] == "uploaded" and body["held_out"]["derivation"]["side"] == "held_out"
        assert body["held_out"]["derivation"]["fraction"] == 0.25 and body["held_out"]["derivation"]["seed"] == 0
        refused = api.post(address, {"held_out": 40, "train_name": "qa", "held_out_name": "qa-eval"},
                           content_type="application/json")
        assert refused.status_code == 400
        assert set(refused.json()["errors"]) == {"held_out", "train_name"}
        unknown = api.post(address, {"held_out": 0.1, "val_size": 0.1}, content_type="application/json")
        assert unknown.status_code == 400 and "val_size" in unknown.json()["errors"]


# --------------------------------------------------------------------------------------------
# A version without its exact repeats, or without the rows another version holds: new versions of the same dataset,
# written through the split's path (``services.dataset_derivation_write``).

def write_derived(sent) -> DatasetVersion:
    """Run the queued derivation of one version as the worker would, then its check; the version as it ends."""
    (_name, (version_id,)), = [task for task in sent if task[0] == services.DERIVE_TASK]
    sent.clear()
    services.dataset_derivation_write(version_ids=[version_id])
    for name, (checked_id,) in sent:
        assert name == services.VALIDATE_TASK
        services.dataset_version_validate(version_id=checked_id)
    return DatasetVersion.objects.select_related("dataset").get(pk=version_id)


def eval_rows() -> list[dict]:
    """Three rows: chat question 1 (three times in ``labelled_rows``), sum 5 (once there) and one of its own."""
    return [{"question": "chat question 1", "answer": "chat answer 1"}, {"question": "sum 5", "answer": "5"},
            {"question": "held-out only", "answer": "x"}]


def unmarked(text: str) -> str:
    """``text`` without the bidi isolates names are wrapped in (``core.bidi.isolated``)."""
    return text.replace("\u2068", "").replace("\u2069", "")


def saved_counts():
    return Dataset.objects.count(), DatasetVersion.objects.count(), Activity.objects.count()


class TestDerivationRows:
    def test_first_occurrences_keeps_the_first_row_of_each_digest(self):
        keep = derivations.first_occurrences(np.array([5, 6, 5, 7, 6, 5], dtype=np.uint64))
        assert keep.tolist() == [True, True, False, True, False, False]
        assert derivations.first_occurrences(np.array([], dtype=np.uint64)).tolist() == []

    def test_rows_not_in_drops_every_copy_of_a_row_the_other_holds(self):
        keep = derivations.rows_not_in(np.array([1, 2, 3, 2, 4], dtype=np.uint64), np.array([2, 9], dtype=np.uint64))
        assert keep.tolist() == [True, False, True, False, True]

    def test_write_rows_writes_each_row_to_its_file_and_none_dropped(self, tmp_path):
        source = tmp_path / "rows.jsonl"
        source.write_bytes(jsonl([{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]))
        first, second = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
        sizes = derivations.write_rows(source, fmt=formats.FileFormat.JSONL, destinations=np.array([0, -1, 1, 0]),
                                       paths=[first, second])
        assert first.read_text() == '{"n":1}\n{"n":4}\n' and second.read_text() == '{"n":3}\n'
        assert sizes == [first.stat().st_size, second.stat().st_size]

    def test_write_rows_refuses_a_file_of_other_rows_and_leaves_no_file(self, tmp_path):
        source = tmp_path / "rows.jsonl"
        source.write_bytes(jsonl([{"n": 1}, {"n": 2}, {"n": 3}]))
        for destinations in ([0, 0], [0, 0, 0, 0]):  # fewer rows counted than the file holds, and more
            with pytest.raises(derivations.DerivationError, match="other rows than its check counted"):
                derivations.write_rows(source, fmt=formats.FileFormat.JSONL, destinations=np.array(destinations),
                                       paths=[tmp_path / "out.jsonl"])
            assert sorted(path.name for path in tmp_path.iterdir()) == ["rows.jsonl"]


class TestDedupe:
    def test_it_works(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        made = services.dataset_version_derive(version=source, kind="dedupe", user=team.teammate)
        assert (made.dataset_id, made.number, made.status) == (source.dataset_id, 2, VersionStatus.UPLOADED)
        assert made.derivation == {"kind": "dedupe", "source": source.public_id, "dataset": source.dataset.public_id,
                                   "dataset_name": "qa", "number": 1, "removed_rows": 4}
        assert made.original_filename == "rows-deduplicated.jsonl" and made.column_mapping == MAPPING
        made = write_derived(sent)
        assert made.status == VersionStatus.READY, made.errors
        # Rows 27-30 repeat rows 1 and 2 (each twice): the first of each is kept, in file order.
        assert file_rows(made) == labelled_rows()[:26] + labelled_rows()[30:]
        differences = selectors.version_differences(a=source, b=made)
        assert (differences.removed.tolist(), differences.added.tolist()) == ([27, 28, 29, 30], [])
        assert made.statistics["duplicates"]["count"] == 0
        assert selectors.derivation_phrase(made.derivation) == "Derived from v1: 4 exact repeats removed"
        entry = Activity.objects.get(verb=Verb.DATASET_VERSION_DEDUPED, target_id=source.public_id)
        assert entry.actor == team.teammate and entry.details == {"new_version": "qa v2", "removed_rows": 4}

    def test_a_version_without_repeats_is_refused_and_nothing_saved(self, team, sent):
        source = upload(team, jsonl(labelled_rows()[:20]), mapping=MAPPING)
        sent.clear()
        before = saved_counts()
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_derive(version=source, kind="dedupe", user=team.teammate)
        assert refused.value.message_dict == {"version": ["\u2068qa v1\u2069 has no exact repeats: there is nothing "
                                                          "to remove"]}
        assert saved_counts() == before and not sent

    def test_a_version_checked_before_repeats_were_counted_has_them_counted(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        DatasetVersion.objects.filter(pk=source.pk).update(statistics={})
        source.refresh_from_db()
        assert services.dataset_version_derive(version=source, kind="dedupe",
                                               user=team.teammate).derivation["removed_rows"] == 4

    def test_it_rejects_a_version_not_ready_or_an_unknown_kind(self, team, sent):
        waiting = upload(team, jsonl(labelled_rows()), mapping=MAPPING, validate=False)
        sent.clear()
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_derive(version=waiting, kind="dedupe", user=team.teammate)
        assert list(map(unmarked, refused.value.message_dict["version"])) == [
            "qa v1 is waiting for its check: only a ready version can be deduplicated; wait for its check to end"]
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_derive(version=waiting, kind="shuffle", user=team.teammate)
        assert list(refused.value.message_dict) == ["kind"] and "use dedupe" in refused.value.message_dict["kind"][0]
        assert DatasetVersion.objects.count() == 1 and not sent

    def test_requeue_queues_the_derivation_and_a_lost_worker_is_said(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        made = services.dataset_version_derive(version=source, kind="dedupe", user=team.teammate)
        sent.clear()
        services.dataset_version_requeue(version=made)
        assert sent == [(services.DERIVE_TASK, [made.pk])]
        lost = LostWorker(name="default@host", last_seen=None, delivered_at=timezone.now())
        assert services.derivation_requeued((made.pk,), lost=lost)
        made.refresh_from_db()
        assert made.notice.startswith("the worker removing the exact repeats (default@host")
        made = write_derived(sent)
        assert made.status == VersionStatus.READY and made.notice == ""


class TestDecontaminate:
    def test_it_works(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        evaluation = upload(team, jsonl(eval_rows()), name="qa-eval", mapping=MAPPING)
        made = services.dataset_version_derive(version=source, kind="decontaminate", against=evaluation.public_id,
                                               user=team.teammate)
        assert made.dataset_id == source.dataset_id and made.number == 2
        # chat question 1 is rows 1, 27 and 28 of the source (it and its two copies), sum 5 row 36: 4 rows.
        assert made.derivation == {"kind": "decontaminate", "source": source.public_id,
                                   "dataset": source.dataset.public_id, "dataset_name": "qa", "number": 1,
                                   "removed_rows": 4, "against": evaluation.public_id, "against_name": "qa-eval v1"}
        made = write_derived(sent)
        assert made.status == VersionStatus.READY and made.row_count == 36
        removed = selectors.version_differences(a=source, b=made).removed.tolist()
        assert removed == [1, 27, 28, 36]
        assert not [warning for warning in selectors.launch_warnings(task="sft", train=made, evaluation=evaluation)
                    if "shares" in warning]
        assert selectors.derivation_phrase(made.derivation) == "Derived from v1: 4 rows shared with qa-eval v1 removed"
        entry = Activity.objects.get(verb=Verb.DATASET_VERSION_DECONTAMINATED, target_id=source.public_id)
        assert entry.details == {"new_version": "qa v2", "removed_rows": 4, "against": "qa-eval v1"}

    @pytest.mark.parametrize(("against", "words"), [
        ("", "choose the version whose rows to remove"),
        ("dv_nothere", "has no dataset version 'dv_nothere'"),
        ("source", "shares every row with itself"),
        ("prompts", "is a prompts dataset's version and qa v1 a sft one's"),
        ("waiting", "qa-waiting v1 is waiting for its check: only a ready version's rows are known"),
        ("unrelated", "qa v1 shares no row with qa-other v1: there is nothing to remove"),
        ("superset", "every row of qa v1 is in qa-all v1: removing them would leave no row"),
    ])
    def test_it_rejects_a_version_to_remove_the_rows_of_on_its_field_and_saves_nothing(self, team, sent, against,
                                                                                       words):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        others = {
            "source": source,
            "prompts": upload(team, jsonl([{"prompt": "chat question 1"}]), name="qa-prompts", kind="prompts"),
            "waiting": upload(team, jsonl(eval_rows()), name="qa-waiting", mapping=MAPPING, validate=False),
            "unrelated": upload(team, jsonl(eval_rows()[2:]), name="qa-other", mapping=MAPPING),
            "superset": upload(team, jsonl(labelled_rows()), name="qa-all", mapping=MAPPING)}
        sent.clear()
        before = saved_counts()
        with pytest.raises(ValidationError) as refused:
            services.dataset_version_derive(version=source, kind="decontaminate", user=team.teammate,
                                            against=others[against].public_id if against in others else against)
        assert list(refused.value.message_dict) == ["against"]
        assert words in unmarked(refused.value.message_dict["against"][0])
        assert saved_counts() == before and not sent

    def test_a_version_of_another_project_is_unknown(self, team, sent):
        from tests.webapp.factories import make_ready_version, make_team

        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        elsewhere = make_ready_version(make_team(slug="beta").project)
        with pytest.raises(ValidationError, match="has no dataset version"):
            services.dataset_version_derive(version=source, kind="decontaminate", against=elsewhere.public_id,
                                            user=team.teammate)

    def test_neither_version_can_be_deleted_while_it_is_written_and_both_can_after(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        evaluation = upload(team, jsonl(eval_rows()), name="qa-eval", mapping=MAPPING)
        made = services.dataset_version_derive(version=source, kind="decontaminate", against=evaluation.public_id,
                                               user=team.teammate)
        for deleted, words in ((source, "qa v2 is being derived from qa v1"),
                               (evaluation, "qa v2 is being written without the rows it shares with qa-eval v1")):
            with pytest.raises(ValidationError) as refused:
                services.dataset_version_delete(version=deleted)
            assert words in unmarked(" ".join(refused.value.messages))
        write_derived(sent)
        services.dataset_version_delete(version=evaluation)
        origin = selectors.derivation_origin(version=made)
        assert origin.against is None and origin.source == source and "qa-eval v1" in origin.phrase

    def test_a_derivation_whose_source_is_gone_fails_saying_why(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        made = services.dataset_version_derive(version=source, kind="dedupe", user=team.teammate)
        DatasetVersion.objects.filter(pk=source.pk).update(status=VersionStatus.FAILED)  # as if deleted meanwhile
        made = write_derived(sent)
        assert made.status == VersionStatus.FAILED and made.errors[0]["code"] == "dedupe_failed"
        assert unmarked(made.errors[0]["message"]).startswith(
            "the exact repeats could not be removed: qa v1, which it is derived from, was deleted")
        assert not made.absolute_path.exists()


class TestDerivationPages:
    def test_launch_warnings_link_to_the_derivation_they_advise_and_it_opens(self, team, client_for, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        evaluation = upload(team, jsonl(eval_rows()), name="qa-eval", mapping=MAPPING)
        repeats, shared = selectors.launch_warnings(task="sft", train=source, evaluation=evaluation)
        page = reverse("datasets:version", args=[team.project.slug, source.dataset.public_id, 1])
        assert "exact repeat" in repeats and warning_action(repeats) == {
            "url": f"{page}?derive=dedupe#remove-repeats", "label": "Remove the repeats of qa v1"}
        assert "shares" in shared and warning_action(shared) == {
            "url": f"{page}?derive=decontaminate&against={evaluation.public_id}#remove-shared",
            "label": "Remove them from qa v1"}
        client = client_for(team.teammate)
        shown = client.get(warning_action(shared)["url"].split("#")[0]).content.decode()
        assert '<details class="derive-version" id="remove-shared" open>' in shown
        assert f'<option value="{evaluation.public_id}" selected>qa-eval v1</option>' in shown
        shown = client.get(warning_action(repeats)["url"].split("#")[0]).content.decode()
        assert '<details class="derive-version" id="remove-repeats" open>' in shown
        assert "4 of the 40 rows removed" in shown

    def test_a_member_removes_the_repeats_from_the_page(self, team, client_for, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        client = client_for(team.teammate)
        response = client.post(reverse("datasets:dedupe", args=[team.project.slug, source.dataset.public_id, 1]))
        assert response.status_code == 302 and response.url == reverse(
            "datasets:version", args=[team.project.slug, source.dataset.public_id, 2])
        write_derived(sent)
        shown = client.get(response.url).content.decode()
        assert "Derived from v1: 4 exact repeats removed." in shown
        compare = reverse("datasets:compare", args=[team.project.slug, source.dataset.public_id])
        assert f'href="{compare}?a=1&amp;b=2">the rows removed</a>' in shown
        assert 'id="remove-repeats"' not in shown  # v2 has none left

    def test_a_refusal_says_why_and_saves_nothing(self, team, client_for, sent):
        source = upload(team, jsonl(labelled_rows()[:20]), mapping=MAPPING)
        other = upload(team, jsonl(eval_rows()[2:]), name="<b>other</b>", mapping=MAPPING)
        client = client_for(team.teammate)
        response = client.post(reverse("datasets:dedupe", args=[team.project.slug, source.dataset.public_id, 1]),
                               follow=True)
        assert "qa v1 has no exact repeats: there is nothing to remove" in unmarked(response.content.decode())
        response = client.post(reverse("datasets:decontaminate", args=[team.project.slug, source.dataset.public_id, 1]),
                               {"against": other.public_id})
        assert response.status_code == 400
        shown = response.content.decode()
        assert "shares no row with" in shown and 'id="remove-shared" open' in shown
        assert "<b>other</b>" not in shown and "&lt;b&gt;other&lt;/b&gt;" in shown
        assert DatasetVersion.objects.count() == 2

    def test_a_viewer_is_offered_no_derivation(self, team, client_for):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        upload(team, jsonl(eval_rows()), name="qa-eval", mapping=MAPPING)
        page = reverse("datasets:version", args=[team.project.slug, source.dataset.public_id, 1])
        shown = client_for(team.viewer).get(page).content.decode()
        assert "remove-repeats" not in shown and "remove-shared" not in shown


class TestDerivationApi:
    def test_it_derives_once_and_names_the_field_refused(self, team, sent):
        source = upload(team, jsonl(labelled_rows()), mapping=MAPPING)
        evaluation = upload(team, jsonl(eval_rows()), name="qa-eval", mapping=MAPPING)
        _token, secret = token_create(user=team.teammate, name="script")
        api = Client(HTTP_AUTHORIZATION=f"Bearer {secret}")
        address = f"/api/v1/projects/{team.project.slug}/datasets/{source.dataset.public_id}/versions/1/derive/"
        response = api.post(address, {"kind": "dedupe"}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1")
        assert response.status_code == 202, response.content
        body = response.json()
        assert body["number"] == 2 and body["status"] == "uploaded"
        assert body["derivation"]["kind"] == "dedupe" and body["derivation"]["removed_rows"] == 4
        again = api.post(address, {"kind": "dedupe"}, content_type="application/json", HTTP_IDEMPOTENCY_KEY="k1")
        assert again.json()["id"] == body["id"] and again["Idempotent-Replayed"] == "true"
        assert DatasetVersion.objects.filter(dataset=source.dataset).count() == 2
        response = api.post(address, {"kind": "decontaminate", "against": evaluation.public_id},
                            content_type="application/json")
        assert response.status_code == 202 and response.json()["derivation"]["against_name"] == "qa-eval v1"
        refused = api.post(address, {"kind": "decontaminate", "against": source.public_id},
                           content_type="application/json")
        assert refused.status_code == 400 and list(refused.json()["errors"]) == ["against"]
        refused = api.post(address, {"kind": "shuffle"}, content_type="application/json")
        assert refused.status_code == 400 and list(refused.json()["errors"]) == ["kind"]
        assert DatasetVersion.objects.filter(dataset=source.dataset).count() == 3
