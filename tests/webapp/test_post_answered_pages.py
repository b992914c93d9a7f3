"""Three forms answer with a page at their own address (a refused export or edit shown again, a new API
token's secret): a GET of that address, from the address bar after a reload or a bookmark, got a blank
405. It goes to the page the form belongs to, which still answers outsiders with 404."""
from webapp.chat.models import ProjectToken
from webapp.review.models import Campaign
from webapp.runs.models import Run, RunStatus


def test_a_get_of_a_form_s_address_goes_to_its_page(team, client_for):
    run = Run.objects.create(project=team.project, name="r", task="sft", status=RunStatus.SUCCEEDED, spec={},
                             resolved_spec={"output_dir": "/nowhere"}, created_by=team.owner)
    campaign = Campaign.objects.create(project=team.project, name="c", created_by=team.owner)
    pages = {f"/p/alpha/runs/{run.public_id}/edit/": f"/p/alpha/runs/{run.public_id}/",
             f"/p/alpha/review/{campaign.public_id}/export/": f"/p/alpha/review/{campaign.public_id}/",
             "/p/alpha/chat/tokens/": "/p/alpha/chat/"}
    member, outsider = client_for(team.teammate), client_for(team.outsider)
    for address, page in pages.items():
        response = member.get(address)
        assert (response.status_code, response["Location"]) == (302, page), address
        assert member.get(page).status_code == 200, page
        assert outsider.get(address, follow=True).status_code == 404, address
        assert member.put(address).status_code == 405, address
    assert not ProjectToken.objects.exists()  # a GET makes no token
