"""Deleting a review campaign: owners only; its items, reviews, leases and exports' records go, the
dataset versions it exported stay; refused while its items are loading or an export is being written;
a generation under way is stopped by it."""
from tests.webapp.factories import form_token
from tests.webapp.review.conftest import answer
from webapp.core.bidi import isolated
from webapp.datasets.models import DatasetVersion
from webapp.review import services
from webapp.review.models import Campaign, CampaignStatus, Export, ExportStatus, Item, Lease, Review


def url(campaign, suffix=""):
    return f"/p/alpha/review/{campaign.public_id}/{suffix}"


def delete_from_page(client, campaign, capture):
    page = client.get(url(campaign)).content.decode()
    with capture(execute=True):
        return client.post(url(campaign, "delete/"),
                           {"submission_token": form_token(page, after=url(campaign, "delete/"))})


def reviewed_and_exported(campaign, team, carol):
    """Both reviewers agree on the first item, which is exported; the teammate holds the second."""
    first = Item.objects.get(campaign=campaign, sequence=1)
    for reviewer in (team.teammate, carol):
        answer(first, reviewer, "a")
    export = services.export_create(campaign=campaign, user=team.owner,
                                    options=services.ExportOptions(dataset_name="prefs reviewed"))
    services.export_write(export_id=export.pk)
    services.queue_next_item(campaign=campaign, user=team.teammate)
    return Export.objects.get(pk=export.pk).version


def test_an_owner_deletes_a_campaign_and_the_versions_it_exported_stay(
        campaign, team, carol, client_for, django_capture_on_commit_callbacks):
    exported = reviewed_and_exported(campaign, team, carol)
    assert exported is not None and Lease.objects.exists()
    client = client_for(team.owner)
    response = delete_from_page(client, campaign, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == "/p/alpha/review/"
    assert (f"Deleted the review campaign {isolated('pass 1')} with its 4 items and their reviews."
            in client.get("/p/alpha/review/").content.decode())
    for model in (Campaign, Item, Review, Lease, Export):
        assert not model.objects.exists(), model
    assert DatasetVersion.objects.filter(pk=exported.pk).exists()
    assert exported.absolute_path.is_file()
    assert client.get(url(campaign)).status_code == 404


def test_only_an_owner_may_delete_a_campaign(campaign, team, client_for):
    """Its reviewers (members) and viewers get 403 and no form; an outsider gets 404."""
    for user in (team.teammate, team.viewer):
        client = client_for(user)
        assert 'id="delete-confirm"' not in client.get(url(campaign)).content.decode()
        assert client.post(url(campaign, "delete/")).status_code == 403
    assert client_for(team.outsider).post(url(campaign, "delete/")).status_code == 404
    assert 'id="delete-confirm"' in client_for(team.owner).get(url(campaign)).content.decode()
    assert Campaign.objects.filter(pk=campaign.pk).exists()


def test_a_campaign_is_not_deleted_while_its_items_load_or_an_export_is_written(
        campaign, team, carol, client_for, django_capture_on_commit_callbacks):
    """QA: the page offered "Delete…" while the deletion would be refused; it now says why instead, and a page
    opened before (which still has the button) is refused in words."""
    client = client_for(team.owner)
    opened_before = client.get(url(campaign)).content.decode()
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.LOADING)
    page = client.get(url(campaign)).content.decode()
    assert 'id="delete-confirm"' not in page
    assert "Delete is offered once nothing is working on it: its items are loading; wait until it is ready." in page
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(campaign, "delete/"),
                               {"submission_token": form_token(opened_before, after=url(campaign, "delete/"))})
    assert response["Location"] == url(campaign)
    assert ("Nothing was deleted: its items are loading; wait until it is ready."
            in client.get(url(campaign)).content.decode())
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.READY)
    opened_before = client.get(url(campaign)).content.decode()
    Export.objects.create(campaign=campaign, dataset_name="out", status=ExportStatus.WRITING)
    # The dataset name, typed by an owner, is isolated: a right-to-left one drew the words after it into itself.
    page = client.get(url(campaign)).content.decode()
    assert 'id="delete-confirm"' not in page
    assert f"its export to {isolated('out')} is being written; wait until it is done." in page
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url(campaign, "delete/"),
                               {"submission_token": form_token(opened_before, after=url(campaign, "delete/"))})
    assert (f"Nothing was deleted: its export to {isolated('out')} is being written; wait until it is done."
            in client.get(response["Location"]).content.decode())
    assert Campaign.objects.filter(pk=campaign.pk).exists()
