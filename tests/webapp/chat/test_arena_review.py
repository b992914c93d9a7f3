"""Arena battles to team review from the arena and leaderboard pages: ticked battles or every
decisive vote, each battle once per campaign, a new campaign on the votes; owners only, outsiders 404."""
import re

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.chat import arena, selectors, services
from webapp.chat.models import Battle
from webapp.core.bidi import isolated
from webapp.review import services as review_services
from webapp.review.models import Campaign, CampaignStatus, Item, ItemSource


@pytest.fixture(autouse=True)
def sent(monkeypatch):
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **options: None)


@pytest.fixture
def models(team):
    return [make_base_model(team.project, name=name, path=f"/models/{name}") for name in ("falcon", "heron")]


def voted_battle(team, user, prompt, outcome, answers=("Blue.", "Seven.")) -> Battle:
    battle = arena.battle_create(project=team.project, user=user, prompt=prompt,
                                 choices=selectors.model_choices(project=team.project))
    for side, text in zip((battle.side_a, battle.side_b), answers):
        services.message_finish(message_id=arena.battle_answer(side).public_id, text=text, finish_reason="stop")
    return arena.battle_vote(battle=battle, outcome=outcome) if outcome else battle


@pytest.fixture
def campaign(team):
    return review_services.campaign_create(project=team.project, name="arena pass", guidelines="", source_version=None,
                                           required_reviews=1, reviewers=[team.teammate], user=team.owner)


def send_url(team):
    return reverse("chat:arena_to_review", args=[team.project.slug])


def test_ticked_battles_go_to_the_campaign_once(team, client_for, models, campaign):
    mine = voted_battle(team, team.owner, "Name a colour.", "b")
    tie = voted_battle(team, team.owner, "Say hi.", "tie", answers=("Hi.", "Hello."))
    client = client_for(team.owner)
    response = client.post(send_url(team), {"campaign": campaign.public_id, "scope": "selected",
                                            "battle": [mine.public_id, tie.public_id]})
    assert response.status_code == 302 and response.url == reverse("chat:arena", args=[team.project.slug])
    items = {item.metadata["battle"]: item for item in campaign.items.all()}
    assert set(items) == {mine.public_id, tie.public_id}
    assert items[mine.public_id].original_label == "b" and items[tie.public_id].original_label == ""
    assert items[mine.public_id].metadata["vote"] == "b"
    client.post(send_url(team), {"campaign": campaign.public_id, "scope": "selected", "battle": [mine.public_id]})
    assert campaign.items.count() == 2, "a battle is never added twice"
    page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert "0 battles added to \u2068arena pass\u2069; 1 already there." in page


def test_all_decisive_battles_of_the_project_not_yet_sent(team, client_for, models, campaign):
    first = voted_battle(team, team.owner, "Name a colour.", "a")
    arena.battles_to_review(campaign=campaign, battles=[first])
    others = voted_battle(team, team.teammate, "Name a bird.", "b")  # another voter's battle counts too
    voted_battle(team, team.teammate, "Say hi.", "both_bad")  # not decisive
    voted_battle(team, team.teammate, "Unvoted.", "")
    response = client_for(team.owner).post(send_url(team), {"campaign": campaign.public_id, "scope": "all",
                                                            "back": "leaderboard"})
    assert response.url == reverse("chat:leaderboard", args=[team.project.slug])
    assert sorted(item.metadata["battle"] for item in campaign.items.all()) == sorted([first.public_id,
                                                                                      others.public_id])


def test_battles_without_a_usable_answer_are_left_out(team, models, campaign):
    failed = voted_battle(team, team.owner, "Name a colour.", "a", answers=("Blue.", ""))
    unvoted = voted_battle(team, team.owner, "Say hi.", "")
    blank = voted_battle(team, team.owner, "Say nothing.", "b", answers=("Blue.", "\n\n  \n"))  # QA: its export failed
    send = arena.battles_to_review(campaign=campaign, battles=[failed, unvoted, blank])
    assert (send.added, send.already_sent, send.unusable) == (0, 0, 3)
    assert not campaign.items.exists()


def test_only_a_ready_campaign_takes_battles(team, models, campaign):
    battle = voted_battle(team, team.owner, "Name a colour.", "a")
    Campaign.objects.filter(pk=campaign.pk).update(status=CampaignStatus.GENERATING)
    campaign.refresh_from_db()
    with pytest.raises(ValidationError, match="send battles once it is ready"):
        arena.battles_to_review(campaign=campaign, battles=[battle])


def test_a_new_campaign_from_arena_votes(team, client_for, models):
    voted_battle(team, team.owner, "Name a colour.", "a")
    voted_battle(team, team.teammate, "Name a bird.", "b")
    response = client_for(team.owner).post(reverse("chat:arena_review_create", args=[team.project.slug]),
                                           {"name": "votes pass", "required_reviews": "1"})
    campaign = Campaign.objects.get(project=team.project, name="votes pass")
    assert response.url == reverse("review:detail", args=[team.project.slug, campaign.public_id])
    assert campaign.items.count() == 2 and campaign.required_reviews == 1
    assert set(campaign.reviewers.values_list("username", flat=True)) == {team.owner.username,
                                                                          team.teammate.username}


def test_a_new_campaign_needs_decisive_votes(team, client_for, models):
    voted_battle(team, team.owner, "Say hi.", "tie")
    response = client_for(team.owner).post(reverse("chat:arena_review_create", args=[team.project.slug]),
                                           {"name": "votes pass", "required_reviews": "2"}, follow=True)
    assert b"no decisive vote" in response.content
    assert not Campaign.objects.filter(name="votes pass").exists(), "nothing half-made"



def test_a_new_campaign_refuses_reviews_per_item_that_are_not_typed_digits(team, client_for, models):
    """int() read "1_0" as 10 reviews per item and made the campaign."""
    voted_battle(team, team.owner, "Name a colour.", "a")
    for typed in ("1_0", "abc", "", "-3", "²"):
        response = client_for(team.owner).post(reverse("chat:arena_review_create", args=[team.project.slug]),
                                               {"name": "votes pass", "required_reviews": typed}, follow=True)
        assert b"Reviews per item must be a whole number from 1 to 10." in response.content, typed
    assert not Campaign.objects.filter(name="votes pass").exists()

def test_the_pages_offer_it_to_owners_only(team, client_for, models, campaign):
    voted_battle(team, team.owner, "Name a colour.", "a")
    for name in ("chat:arena", "chat:leaderboard"):
        url = reverse(name, args=[team.project.slug])
        owner_page = client_for(team.owner).get(url).content.decode()
        assert "Send all decisive battles not yet sent" in owner_page and "arena pass" in owner_page
        assert "New review campaign from arena votes" in owner_page
        assert "Send all decisive" not in client_for(team.teammate).get(url).content.decode()
    assert 'name="battle"' in client_for(team.owner).get(reverse("chat:arena", args=[team.project.slug])).content.decode()


def test_battles_are_ticked_only_where_a_campaign_can_take_them(team, client_for, models):
    """QA: with no campaign ready for battles, the owner's arena table still had its Send column of check boxes,
    tied to a form the page did not hold (no campaign to pick, no button to send them): ticks that did nothing."""
    voted_battle(team, team.owner, "Name a colour.", "a")
    page = client_for(team.owner).get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert 'id="to-review-form"' not in page
    assert 'name="battle"' not in page and "<th>Send</th>" not in page
    review_services.campaign_create(project=team.project, name="arena pass", guidelines="", source_version=None,
                                    required_reviews=1, reviewers=[team.teammate], user=team.owner)
    page = client_for(team.owner).get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert 'id="to-review-form"' in page and 'name="battle"' in page and "<th>Send</th>" in page


def test_the_messages_isolate_the_campaigns_name(team, client_for, models):
    """A right-to-left name ran into the counts after it ("2 battles added to סקירה; 1 already there" read with the
    count taken into the name); the review pages' own messages isolate it, and now so do the arena's."""
    voted_battle(team, team.owner, "Name a colour.", "a")
    client = client_for(team.owner)
    client.post(reverse("chat:arena_review_create", args=[team.project.slug]),
                {"name": "סקירה", "required_reviews": "1", "submission_token": "a" * 24})
    campaign = Campaign.objects.get(name="סקירה")
    page = client.get(reverse("review:detail", args=[team.project.slug, campaign.public_id])).content.decode()
    assert "Campaign \u2068סקירה\u2069 created: 1 battle added to \u2068סקירה\u2069." in page
    client.post(send_url(team), {"campaign": campaign.public_id, "scope": "all"})
    page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert "0 battles added to \u2068סקירה\u2069; 1 already there." in page


def test_it_requires_the_owner_role_and_the_project(team, client_for, models, campaign):
    battle = voted_battle(team, team.teammate, "Name a colour.", "a")
    data = {"campaign": campaign.public_id, "scope": "all"}
    assert client_for(team.teammate).post(send_url(team), data).status_code == 403
    assert client_for(team.viewer).post(send_url(team), data).status_code == 403
    assert client_for(team.outsider).post(send_url(team), data).status_code == 404
    create = reverse("chat:arena_review_create", args=[team.project.slug])
    assert client_for(team.teammate).post(create, {"name": "x"}).status_code == 403
    assert client_for(team.outsider).post(create, {"name": "x"}).status_code == 404
    # Another member's battle cannot be ticked, and another project's campaign is not found.
    response = client_for(team.owner).post(send_url(team), {"campaign": campaign.public_id, "scope": "selected",
                                                            "battle": [battle.public_id]})
    assert response.status_code == 404
    theirs = review_services.campaign_create(project=team.outsider_project, name="theirs", guidelines="",
                                             source_version=None, required_reviews=1, reviewers=[],
                                             user=team.outsider)
    assert client_for(team.owner).post(send_url(team), {"campaign": theirs.public_id, "scope": "all"}).status_code == 404
    assert not Item.objects.exists()


def test_battle_text_is_escaped_in_the_review(team, client_for, models, campaign):
    battle = voted_battle(team, team.owner, "<script>alert(1)</script>", "a",
                          answers=("<img src=x onerror=alert(2)>", "fine"))
    arena.battles_to_review(campaign=campaign, battles=[battle])
    page = client_for(team.teammate).get(reverse("review:next", args=[team.project.slug, campaign.public_id]))
    text = page.content.decode()
    assert "<script>alert(1)" not in text and "<img src=x" not in text and "&lt;img src=x onerror" in text


def test_a_new_campaign_on_the_votes_asks_for_no_more_reviews_per_item_than_it_has_reviewers(team, client_for, models):
    """Its reviewers are the project's members and owners; the form started at 2 reviews per item, so an
    owner working alone made a campaign that said no item could ever be complete."""
    from webapp.projects.models import Membership

    field = 'id="id_arena_required_reviews" value="{}"'
    for name in ("arena", "leaderboard"):
        assert field.format(2) in client_for(team.owner).get(reverse(f"chat:{name}", args=[team.project.slug])).content.decode()
    Membership.objects.filter(project=team.project, user=team.teammate).delete()  # the viewer reviews nothing
    for name in ("arena", "leaderboard"):
        assert field.format(1) in client_for(team.owner).get(reverse(f"chat:{name}", args=[team.project.slug])).content.decode()



def test_a_new_campaign_on_the_votes_refuses_more_reviews_per_item_than_the_project_has_reviewers(
        team, client_for, models):
    """Its reviewers are every member and owner of the project, so reviews per item above their number can never be
    given: the campaign was made with only a warning on its page that no item could be complete. It is refused,
    naming how many may review, and nothing is made; the field offers no more."""
    voted_battle(team, team.owner, "Name a colour.", "a")
    owner = client_for(team.owner)
    response = owner.post(reverse("chat:arena_review_create", args=[team.project.slug]),
                          {"name": "votes pass", "required_reviews": "3"}, follow=True)
    assert ("reviews per item is 3, but 2 people of this project may review (its members and owners): ask for at most "
            "2, or add members first") in response.content.decode()
    assert not Campaign.objects.filter(name="votes pass").exists(), "nothing half-made"
    page = owner.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert 'id="id_arena_required_reviews" value="2" min="1" max="2"' in page
    owner.post(reverse("chat:arena_review_create", args=[team.project.slug]),
               {"name": "votes pass", "required_reviews": "2"})
    assert Campaign.objects.get(name="votes pass").required_reviews == 2


@pytest.fixture
def generated(team, models):
    """A ready campaign on two models' answers (falcon as A, heron as B) to two prompts, as the serve worker
    leaves it."""
    prompts = make_ready_version(team.project, name="questions", kind="prompts",
                                 rows=[{"prompt": "Name a colour."}, {"prompt": "Name a bird."}], user=team.owner)
    campaign = review_services.campaign_generate(
        project=team.project, name="falcon vs heron", guidelines="", required_reviews=1, reviewers=[team.teammate],
        model_a=models[0].public_id, model_b=models[1].public_id, prompts_version=prompts, prompt_count=2,
        sampling=review_services.GenerationSettings(max_new_tokens=16, temperature=0.0), user=team.owner)
    return review_services.generation_finish(
        campaign_id=campaign.pk, prompts=review_services.generation_prompts(campaign=campaign),
        answers_a=["Blue.", "Heron."], answers_b=["Red.", "Falcon."])


def test_a_campaign_on_two_models_answers_is_not_offered_to_battles(team, client_for, models, campaign, generated):
    """The arena's "send to review" listed the campaigns Temper generated from two models' answers, whose page says
    they compare those two models on a dataset's prompts: a battle sent there made that untrue (other models,
    other prompts, in its model preference and its export). Only the campaigns battles can go to are offered."""
    assert generated.status == CampaignStatus.READY and generated.items.count() == 2
    voted_battle(team, team.owner, "Name a colour.", "a")
    for name in ("chat:arena", "chat:leaderboard"):
        page = client_for(team.owner).get(reverse(name, args=[team.project.slug])).content.decode()
        offered = page.split('id="id_review_campaign"')[1].split("</select>")[0]
        assert "arena pass" in offered and "falcon vs heron" not in offered, name


def test_with_only_a_generated_campaign_ready_the_page_says_none_takes_battles(team, client_for, models, generated):
    voted_battle(team, team.owner, "Name a colour.", "a")
    for name in ("chat:arena", "chat:leaderboard"):
        page = client_for(team.owner).get(reverse(name, args=[team.project.slug])).content.decode()
        assert 'id="id_review_campaign"' not in page and "Send all decisive battles" not in page
        assert ("No review campaign can take battles: campaigns on two models' answers take none, and no "
                "other is ready. Start one on the arena votes:") in page, name
        assert "New review campaign from arena votes" in page


def test_battles_sent_to_a_generated_campaign_are_refused_naming_it(team, client_for, models, generated):
    battle = voted_battle(team, team.owner, "Name a colour.", "a")
    message = (f"campaign {isolated('falcon vs heron')} compares the answers of {isolated('Base model: falcon')} and "
               f"{isolated('Base model: heron')} to the same prompts; arena battles go to a campaign on arena votes "
               "or on a dataset")
    with pytest.raises(ValidationError) as refused:
        arena.battles_to_review(campaign=generated, battles=[battle])
    assert refused.value.message_dict == {"campaign": [message]}
    response = client_for(team.owner).post(send_url(team), {"campaign": generated.public_id, "scope": "all"},
                                           follow=True)
    assert message.replace("'", "&#x27;") in response.content.decode()
    assert not generated.items.filter(source=ItemSource.ARENA).exists()


def test_the_conflicts_page_names_each_battles_models(team, client_for, models):
    """An arena campaign's items pair different models, each in its battle's order: the conflicts page named none,
    and its owner could not tell what two models the reviewers disagreed on."""
    from tests.webapp.review.conftest import answer

    campaign = review_services.campaign_create(project=team.project, name="arena pass", guidelines="",
                                               source_version=None, required_reviews=2,
                                               reviewers=[team.owner, team.teammate], user=team.owner)
    falcon, heron = selectors.model_choices(project=team.project)
    battles = []
    for prompt, pair in (("Name a colour.", (falcon, heron)), ("Name a bird.", (heron, falcon))):
        battle = arena.battle_create(project=team.project, user=team.owner, prompt=prompt, choices=[], compare=pair)
        for side, text in zip((battle.side_a, battle.side_b), ("Blue.", "Seven.")):
            services.message_finish(message_id=arena.battle_answer(side).public_id, text=text, finish_reason="stop")
        battles.append(arena.battle_vote(battle=battle, outcome="a"))
    arena.battles_to_review(campaign=campaign, battles=battles)
    for item in campaign.items.all():
        answer(item, team.owner, "a")
        answer(item, team.teammate, "b")
    page = client_for(team.owner).get(reverse("review:conflicts", args=[team.project.slug, campaign.public_id]))
    headings = re.findall(r'<h3>([AB]) · <bdi class="model">([^<]*)</bdi></h3>', page.content.decode())
    assert headings == [("A", "Base model: falcon"), ("B", "Base model: heron"),
                        ("A", "Base model: heron"), ("B", "Base model: falcon")]


def test_older_battles_are_paged_and_ticked_from_their_page(team, client_for, models, campaign):
    """The arena listed the voter's latest 50 battles and no more: an older one could not be seen, nor ticked to be
    sent to review. The list is paged; a page's ticked battles are sent from it, and the owner is back on that page."""
    from tests.webapp.chat.test_arena import battles_up_to

    oldest = voted_battle(team, team.owner, "The oldest question.", "a")
    battles_up_to(team, models, 61, user=team.owner)
    client = client_for(team.owner)
    arena_url = reverse("chat:arena", args=[team.project.slug])
    first = client.get(arena_url).content.decode()
    assert first.count("Question ") == 50 and "The oldest question." not in first
    assert "Page 1 of 2 · 61 in all" in first and f'href="{arena_url}?page=2"' in first
    second = client.get(arena_url, {"page": "2"}).content.decode()
    assert second.count("Question ") == 10 and "The oldest question." in second
    assert f'name="battle" value="{oldest.public_id}" form="to-review-form"' in second
    assert '<input type="hidden" name="page" value="2">' in second

    response = client.post(send_url(team), {"campaign": campaign.public_id, "scope": "selected",
                                            "battle": [oldest.public_id], "page": "2"})
    assert response.status_code == 302 and response.url == f"{arena_url}?page=2"
    assert [item.metadata["battle"] for item in campaign.items.all()] == [oldest.public_id]
    # Nothing ticked: told so, on the same page too.
    response = client.post(send_url(team), {"campaign": campaign.public_id, "scope": "selected", "page": "2"})
    assert response.url == f"{arena_url}?page=2"
    # A page number that is not one goes back to the first page.
    response = client.post(send_url(team), {"campaign": campaign.public_id, "scope": "all", "page": "2x"})
    assert response.url == arena_url
