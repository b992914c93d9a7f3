"""The dataset list is paged, so that it stays fast with thousands of datasets."""
from webapp.datasets.models import Dataset
from webapp.datasets.views import DATASETS_PER_PAGE

URL = "/p/alpha/datasets/"


def make_datasets(team, count):
    # bulk_create does not call save(), which fills name_key.
    Dataset.objects.bulk_create(
        [Dataset(project=team.project, name=f"set-{index:03d}", name_key=f"set-{index:03d}", kind="sft",
                 created_by=team.owner) for index in range(count)]
    )


def test_it_shows_one_page_at_a_time(team, client_for):
    make_datasets(team, DATASETS_PER_PAGE + 1)
    client = client_for(team.viewer)
    first = client.get(URL).content.decode()
    assert first.count('<span class="badge">sft</span>') == DATASETS_PER_PAGE
    assert "set-000" in first and f"set-{DATASETS_PER_PAGE:03d}" not in first
    assert f"Page 1 of 2 · {DATASETS_PER_PAGE + 1} in all" in first
    second = client.get(URL + "?page=2").content.decode()
    assert second.count('<span class="badge">sft</span>') == 1
    assert f"set-{DATASETS_PER_PAGE:03d}" in second


def test_it_rejects_bad_page_numbers_gracefully(team, client_for):
    make_datasets(team, 3)
    client = client_for(team.viewer)
    for page in ("0", "abc", "99"):
        response = client.get(URL, {"page": page})
        assert response.status_code == 200
        assert response.content.decode().count('<span class="badge">sft</span>') == 3
    assert "Page 1 of" not in client.get(URL).content.decode(), "a single page needs no page links"


def test_a_page_number_is_ascii_digits(team, client_for):
    """Django's paginator reads the page with int(): ' 2', '+2' and Arabic-Indic '٢' were page 2. Every list
    reads its page number as the dataset preview does (webapp.core.numbers.whole_number)."""
    make_datasets(team, DATASETS_PER_PAGE + 1)
    client = client_for(team.viewer)
    for page in (" 2", "+2", "٢", "0_2"):
        assert "Page 1 of 2" in client.get(URL, {"page": page}).content.decode(), page
    assert "Page 2 of 2" in client.get(URL, {"page": "2"}).content.decode()
