"""Dataset pages: access for owner/teammate/viewer/outsider, uploads and their limits, what a
version page shows (escaped untrusted text, errors, statistics), download."""
import asyncio
from datetime import UTC, datetime

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client

from tests.asgi_calls import guard_call
from tests.webapp.factories import form_token, form_tokens, make_team
from webapp.api.services import token_create
from webapp.core.models import Submission
from webapp.core.bidi import isolated
from webapp.core.submissions import TOKEN_FIELD
from webapp.datasets import services
from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus
from webapp.datasets.uploads import MULTIPART_OVERHEAD_BYTES, RequestBodyLimit

ROWS = b'{"prompt": "Hi", "completion": "Hello!"}\n{"prompt": "2+2?", "completion": "4"}\n'
# Three rows read, two of them wrong: the check fails with two problems, the first on line 2.
FAILING_ROWS = b'{"prompt": "a", "completion": "b"}\n{"prompt": 5, "completion": "b"}\n{"prompt": 6, "completion": "b"}\n'


@pytest.fixture(autouse=True)
def no_broker(monkeypatch):
    sent = []
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue: sent.append((name, args)))
    return sent


def make_version(team, content=ROWS, *, name="chats", validate=True):
    version = services.dataset_create_with_upload(
        project=team.project, name=name, kind="sft", upload=SimpleUploadedFile(f"{name}.jsonl", content),
        file_format=None, column_mapping={}, user=team.teammate,
    )
    return services.dataset_version_validate(version_id=version.pk) if validate else version


def version_url(version, suffix=""):
    return f"/p/{version.dataset.project.slug}/datasets/{version.dataset.public_id}/v/{version.number}/{suffix}"


def upload_data(content=ROWS, filename="rows.jsonl", **fields):
    return {"name": "chats", "kind": "sft", "file_format": "", **fields, "file": SimpleUploadedFile(filename, content)}


class TestList:
    url = "/p/alpha/datasets/"

    def test_it_works(self, team, client_for):
        make_version(team)
        response = client_for(team.viewer).get(self.url)
        assert response.status_code == 200
        assert b"chats" in response.content and b"ready" in response.content
        assert b"Upload a dataset" not in response.content  # viewers do not upload

    def test_it_lists_latest_version_in_one_query(self, team, client_for, django_assert_max_num_queries):
        for index in range(5):
            make_version(team, name=f"set-{index}")
        client = client_for(team.owner)
        with django_assert_max_num_queries(8):
            response = client.get(self.url)
        assert response.content.count(b"/v/1/") == 5

    def test_it_requires_access(self, team, client_for):
        assert client_for(team.outsider).get(self.url).status_code == 404
        assert Client().get(self.url).status_code == 302

    def test_a_failed_new_version_points_to_the_ready_one_before_it(self, team, client_for):
        """QA: 'text-ok v2 failed' gave no hint that v1 was still ready to train on."""
        ready = make_version(team)
        failed = services.dataset_version_validate(version_id=services.dataset_version_create(
            dataset=ready.dataset, upload=SimpleUploadedFile("v2.jsonl", FAILING_ROWS), file_format=None,
            column_mapping={}, user=team.teammate).pk)
        row = client_for(team.viewer).get(self.url).content.decode().split(ready.dataset.public_id, 1)[1]
        row = row.split("</tr>", 1)[0]
        assert failed.number == 2 and f'<a href="{version_url(ready)}">v1</a> is the latest ready' in row

    def test_a_failed_latest_version_shows_its_first_problem_not_a_row_count(self, team, client_for):
        """It showed the rows read before the check failed, as if the version held them."""
        version = make_version(team, content=FAILING_ROWS)
        assert version.status == VersionStatus.FAILED and version.row_count == 3
        response = client_for(team.viewer).get(self.url)
        row = response.content.decode().split(version.dataset.public_id, 1)[1].split("</tr>", 1)[0]
        assert '<td class="num">3</td>' not in row
        assert "line 2, <code>prompt</code>: must be a string, got a number" in row
        assert "(and 1 more)" in row

    def test_a_failed_parquet_version_names_the_row_of_its_first_problem(self, team, client_for, tmp_path):
        """QA: a Parquet file has no lines, and the list showed "completion: 'completion' is null" with no word
        of which of its rows."""
        import pyarrow
        import pyarrow.parquet

        pyarrow.parquet.write_table(pyarrow.table({"prompt": ["a", "b"], "completion": ["c", None]}),
                                    tmp_path / "rows.parquet")
        version = services.dataset_version_validate(version_id=services.dataset_create_with_upload(
            project=team.project, name="pairs", kind="sft",
            upload=SimpleUploadedFile("rows.parquet", (tmp_path / "rows.parquet").read_bytes()),
            file_format=None, column_mapping={}, user=team.teammate).pk)
        assert version.status == VersionStatus.FAILED
        client = client_for(team.viewer)
        listed = client.get(self.url).content.decode().split(version.dataset.public_id, 1)[1].split("</tr>", 1)[0]
        detail = client.get(f"/p/alpha/datasets/{version.dataset.public_id}/").content.decode()
        detail = detail.split('<tr class="version"', 1)[1].split("</tr>", 1)[0]
        for row in (listed, detail):
            assert "row 2, <code>completion</code>: &#x27;completion&#x27; is null" in row


class TestUpload:
    url = "/p/alpha/datasets/new/"

    def test_it_works(self, team, client_for, no_broker, django_capture_on_commit_callbacks):
        with django_capture_on_commit_callbacks(execute=True):
            response = client_for(team.teammate).post(self.url, upload_data())
        version = DatasetVersion.objects.get()
        assert response.status_code == 302 and response["Location"] == version_url(version)
        assert version.dataset.kind == "sft" and version.status == VersionStatus.UPLOADED
        assert no_broker == [("worker.tasks.datasets.validate_dataset_version", [version.pk])]

    def test_the_same_upload_sent_twice_makes_one_version(self, team, client_for, no_broker,
                                                         django_capture_on_commit_callbacks):
        client = client_for(team.teammate)
        token = form_token(client.get(self.url).content.decode())
        with django_capture_on_commit_callbacks(execute=True):
            first = client.post(self.url, upload_data(**{TOKEN_FIELD: token}))
            second = client.post(self.url, upload_data(**{TOKEN_FIELD: token}))  # not "already has a dataset named"
        version = DatasetVersion.objects.get()
        assert first.status_code == second.status_code == 302
        assert first["Location"] == second["Location"] == version_url(version) and len(no_broker) == 1
        # Another file under the same token (Back, pick another file, Upload) is a new upload.
        other = client.post(self.url, upload_data(content=ROWS[:41], name="other", **{TOKEN_FIELD: token}))
        assert other.status_code == 302 and DatasetVersion.objects.count() == 2

    def test_an_upload_the_service_refuses_saves_nothing_and_leaves_its_token_usable(
            self, team, client_for, no_broker, django_capture_on_commit_callbacks):
        """The refusal comes from the service, inside the sending's transaction: the form is shown
        again with the error, nothing is kept, and the same token then uploads once."""
        services.dataset_create(project=team.project, name="chats", kind="sft", user=team.owner)
        client = client_for(team.teammate)
        token = form_token(client.get(self.url).content.decode())
        with django_capture_on_commit_callbacks(execute=True):
            refused = client.post(self.url, upload_data(**{TOKEN_FIELD: token}))
        assert refused.status_code == 400
        assert "alpha already has a dataset named &#x27;chats&#x27;" in refused.content.decode()
        assert not DatasetVersion.objects.exists() and not Submission.objects.exists() and no_broker == []
        assert form_tokens(refused.content.decode())  # a form to send again
        with django_capture_on_commit_callbacks(execute=True):
            renamed = [client.post(self.url, upload_data(name="chats-2", **{TOKEN_FIELD: token})) for _ in range(2)]
        version = DatasetVersion.objects.get()
        assert [response["Location"] for response in renamed] == [version_url(version)] * 2 and len(no_broker) == 1

    def test_a_form_sent_back_with_errors_says_to_choose_its_file_again(self, team, client_for):
        """QA: with the name taken, the form came back with the name and kind kept but the file input
        silently empty (a browser keeps no chosen file), and Upload then said only that a file is needed."""
        services.dataset_create(project=team.project, name="chats", kind="sft", user=team.owner)
        refused = client_for(team.teammate).post(self.url, upload_data(filename="שורות.jsonl"))
        assert refused.status_code == 400
        sent_name = isolated("שורות.jsonl")
        assert (f"Choose {sent_name} again: a browser does not keep a chosen file when a form "
                "comes back with errors.") in refused.content.decode()

    def test_a_refused_file_is_not_asked_for_again_twice(self, team, client_for):
        refused = client_for(team.teammate).post(self.url, upload_data(content=b""))
        assert refused.status_code == 400 and "is empty (0 bytes)" in refused.content.decode()
        assert "again: a browser does not keep" not in refused.content.decode()

    def test_an_unknown_format_is_said_next_to_its_field(self, team, client_for):
        """The form came back marked invalid with no message: its Format field's errors were not shown."""
        response = client_for(team.teammate).post(self.url, upload_data(file_format="xml"))
        assert response.status_code == 400 and not DatasetVersion.objects.exists()
        page = response.content.decode()
        field = page.split('for="id_file_format"')[1].split("</div>")[0]
        assert '<small class="error" id="id_file_format_error">Select a valid choice. xml is not one of the available ' \
               'choices.</small>' in field

    def test_a_name_with_an_unknown_extension_is_isolated_in_its_message(self, team, client_for):
        response = client_for(team.teammate).post(self.url, upload_data(filename="صفوف.txt"))
        assert response.status_code == 400 and not DatasetVersion.objects.exists()
        assert (f"cannot tell the format of &#x27;{isolated('صفوف.txt')}&#x27; from its extension"
                in response.content.decode())

    def test_it_passes_the_column_mapping_of_the_kind(self, team, client_for):
        data = upload_data(map_prompt="question", map_completion=" answer ", map_chosen="ignored")
        client_for(team.teammate).post(self.url, data)
        assert DatasetVersion.objects.get().column_mapping == {"prompt": "question", "completion": "answer"}

    def test_it_requires_the_member_role(self, team, client_for):
        assert client_for(team.teammate).get(self.url).status_code == 200
        assert client_for(team.viewer).get(self.url).status_code == 403
        assert client_for(team.viewer).post(self.url, upload_data()).status_code == 403
        assert client_for(team.outsider).post(self.url, upload_data()).status_code == 404
        assert not Dataset.objects.exists()

    def test_it_checks_csrf(self, team):
        client = Client(enforce_csrf_checks=True)
        client.force_login(team.teammate)
        assert client.post(self.url, upload_data()).status_code == 403
        assert not Dataset.objects.exists()

    def test_it_rejects_an_unknown_extension(self, team, client_for):
        response = client_for(team.teammate).post(self.url, upload_data(filename="rows.txt"))
        assert response.status_code == 400 and b"cannot tell the format" in response.content
        assert not Dataset.objects.exists()

    def test_an_empty_file_is_named_with_what_to_do(self, team, client_for, settings):
        stored_before = set(settings.DATA_ROOT.glob("**/*.jsonl"))
        response = client_for(team.teammate).post(self.url, upload_data(content=b"", filename="صفوف.jsonl"))
        assert response.status_code == 400
        # The name isolated: a right-to-left one at the head of the sentence took "is empty" into its run.
        assert (f"{isolated('صفوف.jsonl')} is empty (0 bytes): choose the file that holds your rows"
                in response.content.decode())
        assert not Dataset.objects.exists() and not DatasetVersion.objects.exists()
        assert set(settings.DATA_ROOT.glob("**/*.jsonl")) == stored_before

    def test_it_rejects_two_files_sent_as_one_upload(self, team, client_for, settings, no_broker):
        """QA: a POST with two 'file' parts made a dataset of the last one, the first dropped without a word
        (the API refused it already)."""
        first = make_version(team, validate=False)
        stored_before = set(settings.DATA_ROOT.glob("**/*.jsonl"))
        client = client_for(team.teammate)
        for url in (self.url, f"/p/alpha/datasets/{first.dataset.public_id}/upload/"):
            data = upload_data(name="two-files")
            data["file"] = [SimpleUploadedFile("a.jsonl", ROWS), SimpleUploadedFile("b.jsonl", ROWS)]
            response = client.post(url, data)
            assert response.status_code == 400
            field = response.content.decode().split('for="id_file"')[1].split("</div>")[0]
            assert ('<small class="error" id="id_file_error">2 files were sent: send one file per upload (upload each '
                    'as a version of its own)</small>') in field
        assert list(Dataset.objects.values_list("name", flat=True)) == ["chats"]
        assert DatasetVersion.objects.get() == first
        assert set(settings.DATA_ROOT.glob("**/*.jsonl")) == stored_before

    def test_it_rejects_a_body_over_the_limit_before_reading_it(self, team, client_for, settings):
        settings.TEMPER_MAX_UPLOAD_BYTES = 100
        client = client_for(team.teammate)
        too_long = str(100 + MULTIPART_OVERHEAD_BYTES + 1)
        response = client.post(self.url, upload_data(), CONTENT_LENGTH=too_long)
        assert response.status_code == 413 and b"over the 100" in response.content
        assert not Dataset.objects.exists()

    def test_it_stops_a_file_over_the_limit_while_streaming(self, team, client_for, settings):
        settings.TEMPER_MAX_UPLOAD_BYTES = 1000
        response = client_for(team.teammate).post(self.url, upload_data(content=b'{"text": "x"}\n' * 200))
        assert response.status_code == 413 and b"upload limit" in response.content
        assert not Dataset.objects.exists()

    def test_a_new_version_of_an_existing_dataset(self, team, client_for):
        first = make_version(team)
        url = f"/p/alpha/datasets/{first.dataset.public_id}/upload/"
        response = client_for(team.owner).post(url, {"file_format": "", "file": SimpleUploadedFile("v2.jsonl", ROWS)})
        assert response.status_code == 302
        assert list(first.dataset.versions.values_list("number", flat=True).order_by("number")) == [1, 2]
        assert client_for(team.outsider).get(url).status_code == 404

    def test_a_new_versions_page_says_the_kind_its_rows_must_be(self, team, client_for):
        """QA: the page had no Kind field and named the kind nowhere: only the mapping's field names hinted it."""
        first = make_version(team)
        page = client_for(team.owner).get(f"/p/alpha/datasets/{first.dataset.public_id}/upload/").content.decode()
        assert ('<p class="version-kind">Kind <span class="badge">sft</span>: supervised fine-tuning: '
                "&#x27;prompt&#x27; and &#x27;completion&#x27;, or &#x27;messages&#x27; (a chat), or LLaMA-Factory&#x27;s "
                "ShareGPT or Alpaca layout.</p>") in page

    def test_a_new_version_starts_from_the_last_version_s_column_mapping(self, team, client_for):
        first = services.dataset_create_with_upload(
            project=team.project, name="qa", kind="sft",
            upload=SimpleUploadedFile("qa.jsonl", b'{"question": "Hi", "answer": "Hello!"}\n'),
            file_format=None, column_mapping={"prompt": "question", "completion": "answer"}, user=team.teammate,
        )
        url = f"/p/alpha/datasets/{first.dataset.public_id}/upload/"
        page = client_for(team.teammate).get(url).content.decode()
        assert 'name="map_prompt" value="question"' in page and 'name="map_completion" value="answer"' in page
        assert "Filled in from v1's mapping" in page
        assert 'name="map_prompt" value' not in client_for(team.teammate).get("/p/alpha/datasets/new/").content.decode()


def test_the_asgi_guard_answers_413_without_reading_the_body():
    calls = []

    async def app(scope, receive, send):
        calls.append(scope)

    async def receive():
        raise AssertionError("the body must not be read")

    sent = []

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(app, max_upload_bytes=10)
    too_long = str(10 + MULTIPART_OVERHEAD_BYTES + 1).encode()
    asyncio.run(guard({"type": "http", "headers": [(b"content-length", too_long)]}, receive, send))
    assert sent[0]["status"] == 413 and calls == []
    asyncio.run(guard({"type": "http", "headers": [(b"content-length", b"10")]}, receive, send))
    assert len(calls) == 1


class TestVersionPage:
    def test_it_shows_preview_and_statistics(self, team, client_for):
        version = make_version(team)
        response = client_for(team.viewer).get(version_url(version))
        assert response.status_code == 200
        body = response.content.decode()
        assert "Hello!" in body and "2+2?" in body
        assert 'id="character-charts"' in body and "vendor/plotly-temper.min.js" in body
        assert response.context["charts"][0]["field"] == "completion"

    def test_a_version_without_statistics_says_so(self, team, client_for):
        """It showed the heading 'Lengths in characters.' with nothing under it."""
        version = make_version(team)
        DatasetVersion.objects.filter(pk=version.pk).update(statistics={})
        body = client_for(team.viewer).get(version_url(version)).content.decode()
        assert "Lengths in characters" not in body and 'id="character-charts"' not in body
        assert "No length statistics for this version." in body
        assert "plotly" not in body  # a page that draws no chart does not load plotly (1.4 MB parsed)

    def test_it_escapes_dataset_text(self, team, client_for):
        row = b'{"prompt": "<script>alert(1)</script>", "completion": "<b>bold</b>"}\n'
        version = make_version(team, content=row)
        body = client_for(team.owner).get(version_url(version)).content.decode()
        assert "<script>alert(1)</script>" not in body and "<b>bold</b>" not in body
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in body

    def test_it_folds_long_texts(self, team, client_for):
        long_text = "word " * 200
        version = make_version(team, content=('{"prompt": "p", "completion": "%s"}\n' % long_text).encode())
        body = client_for(team.owner).get(version_url(version)).content.decode()
        assert '<details class="fold">' in body and "1,000 characters" in body

    def test_it_cuts_a_huge_text_in_the_preview(self, team, client_for):
        """A row of 3 MB was sent whole inside its fold: a 70 MB line made a 73 MB page. Its length reads with
        thousands separators (QA: "3000000 characters")."""
        huge = "x" * 3_000_000
        content = ('{"prompt": "p", "completion": "%s"}\n{"messages": [{"role": "user", "content": "%s"}, '
                   '{"role": "assistant", "content": "a"}]}\n' % (huge, huge)).encode()
        response = client_for(team.owner).get(version_url(make_version(team, content=content)))
        body = response.content.decode()
        assert len(body) < 200_000
        assert body.count('<span class="more">3,000,000 characters</span>') == 2
        assert body.count("The preview shows the first 10,000 of 3,000,000 characters; download the file for the "
                          "rest.") == 2

    def test_it_pages_the_preview(self, team, client_for):
        rows = b"".join(b'{"prompt": "p%d", "completion": "c"}\n' % i for i in range(1, 46))
        version = make_version(team, content=rows)
        response = client_for(team.owner).get(version_url(version) + "?page=3")
        preview = response.context["preview"]
        assert (preview.page, preview.page_count) == (3, 3)
        assert [number for number, _ in preview.rows] == [41, 42, 43, 44, 45]
        assert client_for(team.owner).get(version_url(version) + "?page=abc").context["preview"].page == 1

    @pytest.mark.parametrize("asked", ["%202", "2%20", "%2B2", "1_0", "%D9%A2", "0", "-1", "2.0"])
    def test_a_page_number_is_ascii_digits_as_typed(self, team, client_for, asked):
        """int() took ' 2', '+2', '1_0' and Arabic-Indic '٢' (an address a person did not type as a page number)
        as pages 2, 2, 10 and 2. Anything but a positive whole number in ASCII digits is a page not found."""
        rows = b"".join(b'{"prompt": "p%d", "completion": "c"}\n' % i for i in range(1, 46))
        response = client_for(team.owner).get(version_url(make_version(team, content=rows)) + f"?page={asked}")
        assert response.context["preview"].page == 1 and response.context["page_not_found"] is not None
        assert "There is no page" in response.content.decode()

    def test_it_offers_to_jump_to_a_page_of_the_preview(self, team, client_for):
        rows = b"".join(b'{"prompt": "p%d", "completion": "c"}\n' % i for i in range(1, 46))
        version = make_version(team, content=rows)
        response = client_for(team.viewer).get(version_url(version) + "?page=2")
        body = response.content.decode()
        assert '<form method="get" class="inline page-jump">' in body
        assert '<input type="number" name="page" id="preview-page" min="1" max="3" value="2" required>' in body
        assert "no-page" not in body

    @pytest.mark.parametrize(("asked", "shown"), [("0", 1), ("-4", 1), ("7", 3), ("abc", 1), ("2.5", 1)])
    def test_it_rejects_a_page_it_does_not_have_with_a_message(self, team, client_for, asked, shown):
        rows = b"".join(b'{"prompt": "p%d", "completion": "c"}\n' % i for i in range(1, 46))
        version = make_version(team, content=rows)
        response = client_for(team.viewer).get(version_url(version), {"page": asked})
        assert response.status_code == 200 and response.context["preview"].page == shown
        assert (f'<p class="error no-page" role="alert">There is no page <bdi>{asked}</bdi>: the preview has 3 pages; '
                f'this is page {shown}.</p>') in response.content.decode()

    def test_it_says_the_preview_stops_before_the_rows_of_a_long_file(self, team, client_for, monkeypatch):
        """Pages stop at PREVIEW_MAX_ROW rows (read by scanning the file): past them the last page said
        'page 3 of 3' and a number jump past it 'there is no page', with no word of the rows left out."""
        from webapp.datasets import selectors

        monkeypatch.setattr(selectors, "PREVIEW_MAX_ROW", 40)
        rows = b"".join(b'{"prompt": "p%d", "completion": "c"}\n' % i for i in range(1, 46))
        version = make_version(team, content=rows)
        page = client_for(team.viewer).get(version_url(version), {"page": "2"}).content.decode()
        assert client_for(team.viewer).get(version_url(version)).context["preview"].page_count == 2
        assert (f'<p class="muted preview-limit">The preview pages through the first 40 rows; '
                f'<a href="{version_url(version, "download/")}">download the file</a> for the rest.</p>') in page
        assert "preview-limit" not in client_for(team.viewer).get(version_url(make_version(team, name="short"))
                                                                  ).content.decode()

    def test_a_page_asked_for_is_escaped_in_its_message(self, team, client_for):
        version = make_version(team)
        body = client_for(team.viewer).get(version_url(version), {"page": "<b>x</b>"}).content.decode()
        assert "<b>x</b>" not in body and "There is no page <bdi>&lt;b&gt;x&lt;/b&gt;</bdi>" in body

    def test_it_searches_the_rows_in_any_letter_case_chats_included(self, team, client_for, monkeypatch):
        from webapp.datasets import selectors

        rows = b"".join(b'{"prompt": "question %d", "completion": "%s"}\n' % (i, b"Refund please" if i % 10 == 0 else b"ok")
                        for i in range(1, 46))
        rows += '{"messages": [{"role": "user", "content": "Wo ist die STRASSE?"}, {"role": "assistant", "content": "da"}]}\n'.encode()
        rows += '{"prompt": "un caf\u00e9", "completion": "noir"}\n'.encode()
        version = make_version(team, content=rows)
        viewer = client_for(team.viewer)
        response = viewer.get(version_url(version), {"q": "refund"})
        preview = response.context["preview"]
        assert [number for number, _ in preview.rows] == [10, 20, 30, 40] and preview.match_count == 4
        body = response.content.decode()
        assert "4 rows of 47 hold “<bdi>refund</bdi>”" in body and 'href="?">Show every row</a>' in body and 'value="refund"' in body
        # casefold, not lower: "straße" finds "STRASSE"; a chat's turns are searched.
        assert [number for number, _ in viewer.get(version_url(version), {"q": "straße"}).context["preview"].rows] == [46]
        # One Unicode form: "café" typed decomposed (e and a combining acute) finds it stored composed.
        assert [number for number, _ in viewer.get(version_url(version), {"q": "CAFE\u0301"}).context["preview"].rows
                ] == [47]
        # Pages of matches (20 a page) keep the search in their links and in the jump form.
        page = viewer.get(version_url(version), {"q": "QUESTION", "page": "2"})
        assert [number for number, _ in page.context["preview"].rows] == list(range(21, 41))
        assert page.context["preview"].page_count == 3
        assert '?page=1&amp;q=QUESTION">← Previous</a>' in page.content.decode()
        assert '<input type="hidden" name="q" value="QUESTION">' in page.content.decode()
        # A page past the last shows the last (and says so), one before the first the first.
        past = viewer.get(version_url(version), {"q": "QUESTION", "page": "9"})
        assert [number for number, _ in past.context["preview"].rows] == list(range(41, 46))
        assert "There is no page <bdi>9</bdi>" in past.content.decode()
        assert viewer.get(version_url(version), {"q": "QUESTION", "page": "0"}).context["preview"].rows[0][0] == 1
        # No match says so, with the text escaped; a search never reaches past the preview's rows.
        body = viewer.get(version_url(version), {"q": "<img src=x onerror=alert(1)>"}).content.decode()
        assert "<img src=x" not in body and "No row holds “<bdi>&lt;img src=x onerror=alert(1)&gt;</bdi>”" in body
        monkeypatch.setattr(selectors, "PREVIEW_MAX_ROW", 15)
        limited = viewer.get(version_url(version), {"q": "refund"})
        assert limited.context["preview"].match_count == 1
        assert "1 row of the first 15 holds" in limited.content.decode()

    def test_it_shows_errors_of_a_failed_version(self, team, client_for):
        version = make_version(team, content=b'{"prompt": "a", "completion": "b"}\n{"prompt": 5, "completion": "b"}\n')
        body = client_for(team.viewer).get(version_url(version)).content.decode()
        assert "1 problem found" in body and "must be a string, got a number" in body
        assert '<tr class="error-row" data-code="wrong_type">' in body

    def test_the_same_problem_on_many_rows_is_listed_once_with_its_lines(self, team, client_for):
        """QA: a file whose columns were named differently listed 20 problems, two a row, each repeating the
        same paragraph about the columns and the mapping: a screen of it for the two things to fix."""
        rows = b"".join(b'{"question": "q%d", "answer": "a"}\n' % index for index in range(8))
        rows += b'{"prompt": "p", "completion": 5}\n'
        version = make_version(team, content=rows)
        body = client_for(team.viewer).get(version_url(version)).content.decode()
        problems = body.split('<table class="table errors-table">')[1].split("</table>")[0].split('<tr class="error-row"')[1:]
        assert "17 problems found" in body and len(problems) == 3
        first, second, third = problems
        assert '<span class="cell-label">lines </span>1, 2, 3, 4, 5 and 3 more</td>' in first
        assert "<code>prompt</code>" in first and first.count("missing &#x27;prompt&#x27;") == 1
        assert '<span class="cell-label">lines </span>1, 2, 3, 4, 5 and 3 more</td>' in second
        assert "<code>completion</code>" in second
        assert '<span class="cell-label">line </span>9</td>' in third and "must be a string" in third

    def test_a_failed_version_shows_no_row_count(self, team, client_for):
        version = make_version(team, content=FAILING_ROWS)
        body = client_for(team.viewer).get(version_url(version)).content.decode()
        assert "<dt>Rows</dt>" not in body
        assert "2 problems found" in body

    def test_it_refreshes_while_validating(self, team, client_for):
        version = make_version(team, validate=False)
        body = client_for(team.viewer).get(version_url(version)).content.decode()
        assert '<meta http-equiv="refresh" content="2">' in body and "Waiting for a worker" in body
        assert 'src="/static/page_refresh.js" data-seconds="2" defer' in body

    def test_a_refused_split_shown_again_does_not_refresh(self, team, client_for):
        """A refused split is the version's page answering the POST: its refresh, while the page's tokens were counted,
        read the split's address again (a 405, or with the script the browser's offer to send the form again) and
        wiped the errors beside the fields."""
        version = make_version(team)
        DatasetVersion.objects.filter(pk=version.pk).update(token_statistics={"status": "computing",
                                                                              "base_model": "tiny"})
        client = client_for(team.teammate)
        assert 'http-equiv="refresh"' in client.get(version_url(version)).content.decode()
        response = client.post(version_url(version, "split/"), {"held_out": "half", "seed": "0", "stratify": "",
                                                                "train_name": "a", "held_out_name": "b"})
        page = response.content.decode()
        assert response.status_code == 400 and "Counting tokens with the <bdi>tiny</bdi> tokenizer…" in page
        assert "&#x27;half&#x27; is not a size" in page
        assert 'http-equiv="refresh"' not in page and "page_refresh.js" not in page

    def test_it_requires_access(self, team, client_for):
        version = make_version(team)
        assert client_for(team.outsider).get(version_url(version)).status_code == 404
        other_dataset_url = f"/p/alpha-elsewhere/datasets/{version.dataset.public_id}/v/1/"
        assert client_for(team.outsider).get(other_dataset_url).status_code == 404
        assert client_for(team.viewer).get(version_url(version).replace("/v/1/", "/v/2/")).status_code == 404


class TestDownload:
    def test_it_works(self, team, client_for):
        version = make_version(team)
        response = client_for(team.viewer).get(version_url(version, "download/"))
        assert response.status_code == 200
        # Sent from an asynchronous iterator: under ASGI Django reads a synchronous one (a FileResponse's
        # too) whole into the web process before sending a byte, and a dataset may be 2 GB.
        assert response.is_async and int(response["Content-Length"]) == len(ROWS)
        assert b"".join(response) == ROWS  # the WSGI test client reads it through Django's sync adapter
        assert response["Content-Disposition"] == 'attachment; filename="chats.jsonl"'

    def test_it_requires_access(self, team, client_for):
        version = make_version(team)
        assert client_for(team.outsider).get(version_url(version, "download/")).status_code == 404

    def test_failed_versions_cannot_be_downloaded(self, team, client_for):
        version = make_version(team, content=b"nope\n")
        assert version.status == VersionStatus.FAILED
        assert client_for(team.owner).get(version_url(version, "download/")).status_code == 404


class TestDatasetPage:
    def test_it_lists_versions(self, team, client_for):
        version = make_version(team)
        url = f"/p/alpha/datasets/{version.dataset.public_id}/"
        response = client_for(team.viewer).get(url)
        assert response.status_code == 200 and b"v1" in response.content
        assert b"Upload a new version" not in response.content
        assert b"Upload a new version" in client_for(team.teammate).get(url).content
        assert client_for(team.outsider).get(url).status_code == 404

    def test_a_failed_version_shows_its_first_problem_not_a_row_count(self, team, client_for):
        version = make_version(team, content=FAILING_ROWS)
        body = client_for(team.viewer).get(f"/p/alpha/datasets/{version.dataset.public_id}/").content.decode()
        row = body.split('<tr class="version"', 1)[1].split("</tr>", 1)[0]
        assert '<td class="num">3</td>' not in row
        assert "line 2, <code>prompt</code>: must be a string, got a number" in row
        assert "(and 1 more)" in row


class TestTokenStatistics:
    def test_it_requires_the_member_role(self, team, client_for):
        version = make_version(team)
        assert client_for(team.viewer).post(version_url(version, "tokens/"), {"base_model": "bm_x"}).status_code == 403
        assert client_for(team.outsider).post(version_url(version, "tokens/"), {"base_model": "bm_x"}).status_code == 404

    def test_an_unknown_base_model_is_refused(self, team, client_for, no_broker):
        version = make_version(team)
        response = client_for(team.teammate).post(version_url(version, "tokens/"), {"base_model": "bm_x"}, follow=True)
        assert b"choose a base model of this project" in response.content
        assert all(name != "worker.tasks.datasets.compute_token_statistics" for name, _ in no_broker)


    def test_a_count_that_never_ends_can_be_asked_again(self, team, client_for, no_broker,
                                                        django_capture_on_commit_callbacks):
        """QA: a count whose task was lost (Redis down when it was sent, its worker killed) stayed 'Counting tokens…'
        for good: the page refreshed every two seconds and hid the form, so it could never be asked again."""
        from tests.webapp.factories import make_base_model

        version = make_version(team)
        base_model = make_base_model(team.project)
        DatasetVersion.objects.filter(pk=version.pk).update(
            token_statistics={"status": "computing", "base_model": base_model.name})
        page = client_for(team.teammate).get(version_url(version)).content.decode()
        assert "Counting tokens with the <bdi>tiny</bdi> tokenizer…" in page
        assert f'action="{version_url(version, "tokens/")}"' in page
        assert "No <code>default</code> worker is running" in page  # nothing counts them
        with django_capture_on_commit_callbacks(execute=True):
            client_for(team.teammate).post(version_url(version, "tokens/"), {"base_model": base_model.public_id})
        assert no_broker[-1] == ("worker.tasks.datasets.compute_token_statistics", [version.pk, base_model.pk])


    @pytest.mark.parametrize("status", ["computing", "failed", "ready"])
    def test_the_base_model_s_name_is_isolated(self, team, client_for, status):
        """QA: a right-to-left base model name ran into the sentence around it ("With the … tokenizer"), as names
        beside it on the page do not."""
        version = make_version(team)
        statistics = {"status": status, "base_model": "نموذج 1", "error": "x", "rows": 2, "fields": {}}
        DatasetVersion.objects.filter(pk=version.pk).update(token_statistics=statistics)
        page = client_for(team.viewer).get(version_url(version)).content.decode()
        assert "<bdi>نموذج 1</bdi>" in page


class TestRequeue:
    def test_it_works(self, team, client_for, no_broker, django_capture_on_commit_callbacks):
        version = make_version(team, validate=False)
        assert b"queue the check again" in client_for(team.teammate).get(version_url(version)).content
        with django_capture_on_commit_callbacks(execute=True):
            response = client_for(team.teammate).post(version_url(version, "requeue/"))
        assert response.status_code == 302
        assert no_broker == [("worker.tasks.datasets.validate_dataset_version", [version.pk])]

    def test_a_check_that_stopped_half_way_can_be_queued_again(self, team, client_for, no_broker,
                                                               django_capture_on_commit_callbacks):
        version = make_version(team, validate=False)
        DatasetVersion.objects.filter(pk=version.pk).update(status=VersionStatus.VALIDATING)
        page = client_for(team.teammate).get(version_url(version)).content
        assert b"Checking the file" in page and b"queue the check again" in page
        with django_capture_on_commit_callbacks(execute=True):
            assert client_for(team.teammate).post(version_url(version, "requeue/")).status_code == 302
        assert no_broker == [("worker.tasks.datasets.validate_dataset_version", [version.pk])]

    def test_it_says_whether_a_default_worker_is_alive(self, team, client_for):
        """First-hour walk: a version waiting for a worker said "Nothing happening? Check that the default worker and
        Redis run", leaving the newcomer to find out which. The page says whether a default-queue worker is alive
        (its heartbeat), as the chat says of serve workers, and links the Workers page."""
        from django.utils import timezone

        from webapp.workers.models import Worker

        version = make_version(team, validate=False)
        client = client_for(team.teammate)
        page = client.get(version_url(version)).content.decode()
        assert "No <code>default</code> worker is running" in page and 'href="/workers/"' in page
        now = timezone.now()
        Worker.objects.create(name="serve@h1", host="h1", pid=1, queues=["serve"], started_at=now, last_seen=now)
        assert "No <code>default</code> worker is running" in client.get(version_url(version)).content.decode()
        Worker.objects.create(name="default@h0", host="h0", pid=1, queues=["default"], started_at=now, last_seen=now)
        page = client.get(version_url(version)).content.decode()
        assert "No <code>default</code> worker" not in page
        assert "A <code>default</code> worker is running" in page and 'href="/workers/"' in page

    def test_it_requires_the_member_role(self, team, client_for):
        version = make_version(team, validate=False)
        assert b"queue the check again" not in client_for(team.viewer).get(version_url(version)).content
        assert client_for(team.viewer).post(version_url(version, "requeue/")).status_code == 403
        assert client_for(team.outsider).post(version_url(version, "requeue/")).status_code == 404


def test_prompts_preview_shows_reference_columns(team, client_for):
    version = services.dataset_create_with_upload(
        project=team.project, name="maths", kind="prompts",
        upload=SimpleUploadedFile("maths.jsonl", b'{"question": "1+1?", "answer": "2", "meta": {"level": 1}}\n'),
        file_format=None, column_mapping={"prompt": "question"}, user=team.teammate,
    )
    version = services.dataset_version_validate(version_id=version.pk)
    preview = client_for(team.viewer).get(version_url(version)).context["preview"]
    assert preview.columns == ("prompt", "answer", "meta")
    [(number, cells)] = preview.rows
    assert number == 1 and [cell.text for cell in cells] == ["1+1?", "2", '{"level": 1}']
    assert [cell.type for cell in cells] == ["text", "text", "json"]


def test_the_asgi_guard_stops_a_chunked_body_past_the_limit():
    # Sent with Transfer-Encoding: chunked there is no Content-Length to refuse; Django's ASGI handler read
    # such a body whole, spooled to disk, before any view or login check: anyone could fill the disk.
    from django.core.asgi import get_asgi_application

    limit = 10 + MULTIPART_OVERHEAD_BYTES
    chunk, chunks_sent = b"x" * 1024, []

    async def receive():
        if len(chunks_sent) == 4000:  # the whole body sent: the client waits for the answer, as a server's would
            await asyncio.Event().wait()
        chunks_sent.append(chunk)
        return {"type": "http.request", "body": chunk, "more_body": len(chunks_sent) < 4000}

    sent = []

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(get_asgi_application(), max_upload_bytes=10)
    scope = {"type": "http", "method": "POST", "path": "/api/v1/openapi.json", "raw_path": b"/api/v1/openapi.json",
             "query_string": b"", "root_path": "", "scheme": "http", "server": ("testserver", 80),
             "client": ("127.0.0.1", 5000), "headers": [(b"host", b"testserver"), (b"transfer-encoding", b"chunked")]}
    asyncio.run(guard(scope, receive, send))
    assert sent[0]["status"] == 413
    assert len(chunks_sent) * len(chunk) <= limit + len(chunk)


def run_the_guard(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[list[str], list[dict]]:
    """``path`` asked through the ASGI guard (an upload limit of 1 GB, 10 bytes elsewhere) with a 5 MB body:
    the paths the application was called with, and what the guard sent itself."""
    return guard_call(path, content_length=5 * 1024 * 1024, headers=headers, max_upload_bytes=10**9,
                      max_other_bytes=10)


def test_the_asgi_guard_takes_upload_sized_bodies_only_where_files_are_uploaded():
    # Every other address takes forms and JSON of at most DATA_UPLOAD_MAX_MEMORY_SIZE; at the upload limit
    # (2 GB) anyone could have Django spool gigabytes to disk at the login page, many requests at a time.
    for path in ("/accounts/login/", "/admin/login/", "/p/alpha/runs/new/", "/api/v1/projects/alpha/runs/",
                 "/v1/chat/completions", "/p/alpha/datasets/new/x"):
        calls, sent = run_the_guard(path, [])
        assert sent[0]["status"] == 413 and calls == [], path


@pytest.mark.django_db(transaction=True)  # the guard reads the session and the token in a thread of its own
def test_the_asgi_guard_takes_upload_sized_bodies_only_from_a_member_of_the_project():
    """secqa: the upload addresses took a body of up to the upload limit (2 GB) from anyone: Django's ASGI handler
    spooled it to disk whole before the login check turned it away, so an anonymous sender could fill the disk a
    few requests at a time. Now only a signed-in member of the project (a member's token for the REST API) may
    send more than the other addresses take."""
    team = make_team()
    sessions = {}
    for role in ("owner", "teammate", "viewer", "outsider"):
        client = Client()
        client.force_login(getattr(team, role))
        sessions[role] = [(b"cookie", f"sessionid={client.cookies['sessionid'].value}; csrftoken=x".encode())]
    tokens = {role: [(b"authorization", f"Bearer {token_create(user=getattr(team, role), name='cli')[1]}".encode())]
              for role in ("teammate", "viewer", "outsider")}
    pages = ["/p/alpha/datasets/new/", "/p/alpha/datasets/ds_abc/upload/"]
    api = "/api/v1/projects/alpha/datasets/"
    for path in pages:
        for role in ("owner", "teammate"):
            assert run_the_guard(path, sessions[role]) == ([path], []), (path, role)
    assert run_the_guard(api, tokens["teammate"]) == ([api], [])

    refused = [(path, []) for path in [*pages, api]] + [(path, sessions[role]) for path in pages
                                                       for role in ("viewer", "outsider")]
    refused += [(pages[0], [(b"cookie", b"sessionid=made-up")]), (pages[0], tokens["teammate"]),
                (api, sessions["teammate"]), (api, tokens["viewer"]), (api, tokens["outsider"]),
                (api, [(b"authorization", b"Bearer tmp_made-up")]), ("/p/beta/datasets/new/", sessions["teammate"])]
    for path, headers in refused:
        calls, sent = run_the_guard(path, headers)
        assert calls == [] and sent[0]["status"] == 413, (path, headers)
        body = sent[1]["body"].decode()
        assert "10 bytes" in body and "member of the project" in body, body

    # Sent chunked (no Content-Length), a body is counted as it comes: the same limits, asked as it passes 10 bytes.
    for headers, whole in ((sessions["teammate"], True), ([], False), (sessions["viewer"], False)):
        read, sent = run_the_guard_chunked(pages[0], headers)
        if whole:
            assert (read, sent) == (3 * 1024 * 1024, []), headers
        else:
            assert read <= 10 + MULTIPART_OVERHEAD_BYTES and sent[0]["status"] == 413, (headers, read)
            assert "member of the project" in sent[1]["body"].decode()


def run_the_guard_chunked(path: str, headers: list[tuple[bytes, bytes]]) -> tuple[int, list[dict]]:
    """``path`` asked through the guard of ``run_the_guard`` with a 3 MB body sent chunked: the bytes the
    application read, and what the guard sent itself."""
    chunk, chunks_sent, read, sent = b"x" * 1024, [], [0], []

    async def app(scope, receive, send):
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            read[0] += len(message["body"])
            if not message["more_body"]:
                return

    async def receive():
        chunks_sent.append(chunk)
        return {"type": "http.request", "body": chunk, "more_body": len(chunks_sent) < 3 * 1024}

    async def send(message):
        sent.append(message)

    guard = RequestBodyLimit(app, max_upload_bytes=10**9, max_other_bytes=10)
    scope = {"type": "http", "path": path, "headers": [(b"transfer-encoding", b"chunked"), *headers]}
    asyncio.run(guard(scope, receive, send))
    return read[0], sent


def test_the_checked_date_shows_the_time_as_every_page_does(team, client_for):
    """The version page's "Checked" read "2026-12-05 14:05:59 UTC" with a hand-typed zone, where every other page
    shows a moment through the ``when`` filter: minutes, and the zone the site's clock names."""
    version = make_version(team)
    DatasetVersion.objects.filter(pk=version.pk).update(validated_at=datetime(2026, 12, 5, 14, 5, 59, tzinfo=UTC))
    page = client_for(team.viewer).get(version_url(version)).content.decode()
    assert "<dt>Checked</dt><dd>2026-12-05 14:05 UTC</dd>" in page


def test_a_ready_version_offers_the_runs_that_train_on_it(team, client_for):
    """QA (preference and RL workflows): a preference dataset just exported from a review campaign said
    nothing of what it was for; a DPO run on it was started from the Runs page by choosing the task and then
    finding the version again among every preference set. The version page now links the launch page of each
    task that trains on its kind, the version chosen as its training data."""
    from tests.webapp.factories import make_ready_version

    pairs = [{"prompt": f"q{i}", "chosen": "good", "rejected": "bad"} for i in range(4)]
    preference = make_ready_version(team.project, name="reviewed", kind="preference", rows=pairs, user=team.teammate)
    page = client_for(team.teammate).get(version_url(preference)).content.decode()
    for task in ("dpo", "reward"):
        assert f'href="/p/alpha/runs/new/?task={task}&amp;data={preference.public_id}"' in page
    assert "?task=grpo" not in page and "?task=sft&" not in page
    # The launch page it leads to has the version chosen as the training data, and the task's tab open.
    launch = client_for(team.teammate).get(f"/p/alpha/runs/new/?task=dpo&data={preference.public_id}").content.decode()
    train_select = launch.split('name="data.train"', 1)[1].split("</select>", 1)[0]
    assert f'<option value="{preference.public_id}" selected>' in train_select
    # Data the task does not train on, or of another project, is not put in the spec: the field stays unchosen.
    prompts = make_ready_version(team.project, name="questions", kind="prompts",
                                 rows=[{"prompt": "q", "answer": "a"}])
    for data in (prompts.public_id, "dv_nothing"):
        page = client_for(team.teammate).get(f"/p/alpha/runs/new/?task=dpo&data={data}")
        assert page.status_code == 200 and f'value="{data}" selected' not in page.content.decode()
    # The link is for members, who launch runs; a viewer's page does not offer it, nor a version not ready.
    assert "/runs/new/?task=" not in client_for(team.viewer).get(version_url(preference)).content.decode()
    DatasetVersion.objects.filter(pk=preference.pk).update(status=VersionStatus.VALIDATING)
    assert "/runs/new/?task=" not in client_for(team.teammate).get(version_url(preference)).content.decode()


class TestFileNameWithQuotes:
    # A browser sends a file input's name in multipart with '"', CR and LF as %22, %0D and %0A (the HTML
    # standard's escape for filename="..."); Django reads the name as sent.
    def test_the_name_is_shown_and_downloaded_as_uploaded(self, team, client_for):
        client = client_for(team.teammate)
        response = client.post("/p/alpha/datasets/new/", upload_data(filename='my %22best%22 rows.jsonl'))
        assert response.status_code == 302
        version = DatasetVersion.objects.get()
        assert version.original_filename == 'my "best" rows.jsonl'
        services.dataset_version_validate(version_id=version.pk)
        page = client.get(version_url(version)).content.decode()
        assert "my &quot;best&quot; rows.jsonl" in page and "%22" not in page
        download = client.get(version_url(version, "download/"))
        # RFC 6266's quoted-string: the quotes escaped (Django's content_disposition_header).
        assert download["Content-Disposition"] == 'attachment; filename="my \\"best\\" rows.jsonl"'
