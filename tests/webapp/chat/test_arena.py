"""Arena: a battle sends one prompt to two different models, names stay hidden until the vote, a
decisive vote becomes a preference pair (exported as a dataset version, or sent to review), the
leaderboard page, access."""
import json
import re

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.template.defaultfilters import floatformat
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from tests.webapp.factories import form_token, make_base_model, thinking_model_dir
from webapp.chat import arena, selectors, services
from webapp.chat.leaderboard import MIN_VOTES_FOR_INTERVAL
from webapp.chat.models import Battle
from webapp.core.submissions import TOKEN_FIELD
from webapp.datasets.models import DatasetVersion


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(services.celery_app, "send_task", lambda name, args, queue, **options: calls.append(args[0]))
    return calls


@pytest.fixture
def models(team):
    return [make_base_model(team.project, name=name, path=f"/models/{name}") for name in ("falcon", "heron")]


def start_battle(team, client_for, prompt="Name a colour.") -> Battle:
    response = client_for(team.teammate).post(reverse("chat:arena", args=[team.project.slug]), {"prompt": prompt})
    assert response.status_code == 302
    return Battle.objects.get(project=team.project, user=team.teammate, prompt=prompt)


def finish(battle, text_a, text_b):
    for side, text in ((battle.side_a, text_a), (battle.side_b, text_b)):
        services.message_finish(message_id=arena.battle_answer(side).public_id, text=text, finish_reason="stop")


def battle_url(name, battle):
    return reverse(f"chat:{name}", args=[battle.project.slug, battle.public_id])


def test_a_battle_asks_two_different_models_and_hides_them_until_the_vote(team, client_for, models, sent,
                                                                        django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        battle = start_battle(team, client_for)
    assert {battle.side_a.model_label, battle.side_b.model_label} == {"Base model: falcon", "Base model: heron"}
    assert sorted(request["model_path"] for request in sent) == ["/models/falcon", "/models/heron"]
    assert all(request["messages"] == [{"role": "user", "content": "Name a colour."}] for request in sent)
    client = client_for(team.teammate)
    page = client.get(battle_url("battle", battle)).content.decode()
    assert "falcon" not in page and "heron" not in page
    # The sides' conversation pages would name the models: they are not chat conversations.
    assert client.get(reverse("chat:detail", args=[team.project.slug, battle.side_a.public_id])).status_code == 404
    assert battle.side_a.public_id.encode() not in client.get(reverse("chat:list", args=[team.project.slug])).content
    assert client.post(battle_url("vote", battle), {"outcome": "a"}).status_code == 302
    assert Battle.objects.get(pk=battle.pk).outcome == ""  # answers still streaming: no vote yet
    finish(battle, "Blue.", "<script>alert(1)</script>")
    client.post(battle_url("vote", battle), {"outcome": "a"})
    page = client.get(battle_url("battle", battle)).content.decode()
    assert "falcon" in page and "heron" in page and "<script>alert" not in page
    assert Battle.objects.get(pk=battle.pk).outcome == "a"


def test_a_battle_takes_the_chats_thinking_switch_for_both_sides(team, client_for, sent, tmp_path,
                                                                  django_capture_on_commit_callbacks):
    """A battle had no Thinking switch: a Qwen3 model answered with thinking on (or as its run trained) whatever one
    wanted to compare. The arena offers the chat's switch for both sides where a model of the project reads
    enable_thinking; each side whose model reads it keeps it, as a chat conversation does, and its request carries it
    over the model's own variables; the battle page says it, and its "another battle" forms keep it."""
    thinker = make_base_model(team.project, name="falcon", path=str(thinking_model_dir(tmp_path / "falcon")))
    plain = make_base_model(team.project, name="heron", path="/models/heron")
    client = client_for(team.teammate)
    arena_url = reverse("chat:arena", args=[team.project.slug])
    page = client.get(arena_url).content.decode()
    assert '<select name="thinking" id="id_thinking"' in page and "Each model&#x27;s default" in page and '<option value="off">Off</option>' in page

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(arena_url, {"prompt": "2+2?", "thinking": "off", "model_a": thinker.public_id,
                                           "model_b": plain.public_id})
    assert response.status_code == 302, response.content
    battle = Battle.objects.get(project=team.project, prompt="2+2?")
    assert (battle.side_a.enable_thinking, battle.side_b.enable_thinking) == (False, None)
    by_path = {request["model_path"]: request for request in sent}
    assert by_path[str(tmp_path / "falcon")]["chat_template_kwargs"] == {"enable_thinking": False}
    assert "chat_template_kwargs" not in by_path["/models/heron"]
    finish(battle, "4.", "Four.")
    client.post(battle_url("vote", battle), {"outcome": "a"})
    page = client.get(battle_url("battle", battle)).content.decode()
    assert "Thinking off (enable_thinking false for the models whose chat template reads it)" in page
    assert '<input type="hidden" name="thinking" value="off">' in page

    sent.clear()
    with django_capture_on_commit_callbacks(execute=True):
        client.post(arena_url, {"prompt": "3+3?", "thinking": "", "model_a": thinker.public_id,
                                "model_b": plain.public_id})
    battle = Battle.objects.get(project=team.project, prompt="3+3?")
    assert (battle.side_a.enable_thinking, battle.side_b.enable_thinking) == (None, None)
    assert all("chat_template_kwargs" not in request for request in sent)
    assert "Thinking" not in client.get(battle_url("battle", battle)).content.decode().split("arena-sides")[0]


def test_the_battle_table_says_whether_thinking_was_on(team, client_for, sent, tmp_path):
    """The table of one's battles did not say which had Thinking on: two battles of one prompt, one with it on and
    one with it off, read alike until each was opened. A Thinking column says on, off, or — (each model's default)."""
    thinker = make_base_model(team.project, name="falcon", path=str(thinking_model_dir(tmp_path / "falcon")))
    plain = make_base_model(team.project, name="heron", path="/models/heron")
    client = client_for(team.teammate)
    arena_url = reverse("chat:arena", args=[team.project.slug])
    for prompt, thinking in (("Thinking on?", "on"), ("Thinking off?", "off"), ("Default?", "")):
        client.post(arena_url, {"prompt": prompt, "thinking": thinking, "model_a": thinker.public_id,
                                "model_b": plain.public_id})
    page = client.get(arena_url).content.decode()
    table = page.split("Your battles")[1].split("</table>")[0]
    assert "<th>Thinking</th>" in table
    cells = {prompt: re.search(rf'>{re.escape(prompt)}</a></td>.*?<td class="battle-thinking">([^<]*)</td>', table,
                               re.S).group(1) for prompt in ("Thinking on?", "Thinking off?", "Default?")}
    assert cells == {"Thinking on?": "on", "Thinking off?": "off", "Default?": "—"}


def test_no_thinking_column_where_no_battle_or_model_has_it(team, client_for, models, sent):
    start_battle(team, client_for)
    page = client_for(team.teammate).get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert "<th>Thinking</th>" not in page and "battle-thinking" not in page


def test_a_thinking_choice_that_is_none_is_refused_naming_it(team, client_for, sent, tmp_path):
    make_base_model(team.project, name="falcon", path=str(thinking_model_dir(tmp_path / "falcon")))
    make_base_model(team.project, name="heron", path="/models/heron")
    client = client_for(team.teammate)
    arena_url = reverse("chat:arena", args=[team.project.slug])
    response = client.post(arena_url, {"prompt": "2+2?", "thinking": "<b>maybe</b>"})
    assert response.status_code == 400
    assert ("Thinking: &#x27;&lt;b&gt;maybe&lt;/b&gt;&#x27; is not a choice; choose on, off, or each model&#x27;s "
            "default (empty)") in response.content.decode()
    assert not Battle.objects.filter(project=team.project).exists() and sent == []


def test_no_thinking_choice_where_no_model_reads_it(team, client_for, models):
    page = client_for(team.teammate).get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert 'name="thinking"' not in page


def test_a_decisive_vote_becomes_a_preference_pair_and_exports(team, client_for, models, sent, settings,
                                                              django_capture_on_commit_callbacks):
    battle = start_battle(team, client_for)
    finish(battle, "Blue.", "Seven.")
    arena.battle_vote(battle=battle, outcome="b")
    tied = start_battle(team, client_for, prompt="Say hi.")
    finish(tied, "Hi.", "Hello.")
    arena.battle_vote(battle=tied, outcome="tie")
    [pair] = arena.preference_pairs(project=team.project)
    assert (pair["prompt"], pair["chosen"], pair["rejected"]) == ("Name a colour.", "Seven.", "Blue.")
    assert pair["arena"]["chosen_model"] == battle.side_b.model_ref
    assert pair["arena"]["rejected_model"] == battle.side_a.model_ref and pair["arena"]["voter"] == "alpha-teammate"
    response = client_for(team.teammate).post(reverse("chat:arena_export", args=[team.project.slug]),
                                              {"dataset_name": "votes"})
    assert response.status_code == 302
    version = DatasetVersion.objects.get(dataset__project=team.project, dataset__name="votes")
    assert version.dataset.kind == "preference"
    rows = [json.loads(line) for line in version.absolute_path.read_text().splitlines()]
    assert [(row["prompt"], row["chosen"], row["rejected"]) for row in rows] == [("Name a colour.", "Seven.", "Blue.")]


@pytest.mark.parametrize("name,says", [
    ("votes\u200b", "an invisible character, U+200B (ZERO WIDTH SPACE), at position 6: remove it"),
    ("v" * 101, "101 characters; at most 100"),
    ("Chats", "\u2068Chats\u2069 is an sft dataset; pick another name"),
])
def test_an_export_refused_for_its_name_says_so_next_to_the_field(team, client_for, models, sent, name, says):
    """The datasets service keys its refusals by its own argument, "name": the arena's export passed them on
    unkeyed as a note at the top of the page, and the name typed was lost."""
    from webapp.datasets.models import Dataset
    from tests.webapp.factories import make_ready_version

    make_ready_version(team.project, name="chats", kind="sft")
    battle = start_battle(team, client_for)
    finish(battle, "Blue.", "Seven.")
    arena.battle_vote(battle=battle, outcome="b")
    with pytest.raises(ValidationError) as refused:
        arena.arena_export(project=team.project, user=team.teammate, dataset_name=name)
    assert list(refused.value.message_dict) == ["dataset_name"] and says in refused.value.messages[0]
    response = client_for(team.teammate).post(reverse("chat:arena_export", args=[team.project.slug]),
                                              {"dataset_name": name})
    assert response.status_code == 400
    form = response.content.decode().split('id="arena-export"')[1].split("</form>")[0]
    assert f'value="{name}" aria-label="Dataset name" aria-invalid="true" aria-describedby="dataset_name-error"' in form
    assert re.search(r'<small class="error" id="dataset_name-error">[^<]*' + re.escape(says), form)
    assert Dataset.objects.filter(project=team.project).count() == 1
    # The page is answered at the export's address: the battle form still posts to the arena's.
    assert f'<form method="post" action="/p/{team.project.slug}/arena/" class="form" id="new-battle"' in (
        response.content.decode())


def test_a_battle_goes_to_review_with_the_vote_as_its_label(team, client_for, models, sent):
    from webapp.review.services import campaign_create

    battle = start_battle(team, client_for)
    finish(battle, "Blue.", "Seven.")
    battle = arena.battle_vote(battle=battle, outcome="a")
    campaign = campaign_create(project=team.project, name="arena", guidelines="", source_version=None,
                               required_reviews=1, reviewers=[team.owner], user=team.owner)
    assert arena.battles_to_review(campaign=campaign, battles=[battle]).added == 1
    [item] = campaign.items.all()
    assert item.source == "arena" and item.original_label == "a"
    assert (item.response_a, item.response_b) == ("Blue.", "Seven.")
    assert item.metadata["battle"] == battle.public_id and item.metadata["model_a"] == battle.side_a.model_ref


def test_the_leaderboard_page_rates_the_models(team, client_for, models, sent):
    for _ in range(3):
        battle = start_battle(team, client_for)
        finish(battle, "x", "y")
        winner = "a" if battle.side_a.model_label == "Base model: falcon" else "b"
        arena.battle_vote(battle=battle, outcome=winner)
        Battle.objects.filter(pk=battle.pk).update(prompt=f"done {battle.pk}")  # the next battle's prompt is new
    page = client_for(team.teammate).get(reverse("chat:leaderboard", args=[team.project.slug])).content.decode()
    assert page.index("Base model: falcon") < page.index("Base model: heron")  # falcon won every vote: ranked first
    assert "100%" in page
    assert page.count("too few votes") == 2  # three votes each: no bootstrap interval worth showing
    assert "95% interval" in page


def test_the_leaderboard_page_shows_intervals_from_the_minimum_number_of_votes(team, client_for, models, sent):
    for number in range(MIN_VOTES_FOR_INTERVAL):
        battle = start_battle(team, client_for, prompt=f"Question {number}")
        finish(battle, "x", "y")
        # falcon wins the odd questions, heron the even ones (the sides are drawn at random): votes both ways
        falcon_won = battle.side_a.model_label == "Base model: falcon"
        arena.battle_vote(battle=battle, outcome="a" if falcon_won == bool(number % 2) else "b")
    ratings, _rates = arena.project_leaderboard(project=team.project)
    page = client_for(team.teammate).get(reverse("chat:leaderboard", args=[team.project.slug])).content.decode()
    assert "too few votes" not in page and "votes all one way" not in page
    for rating in ratings:
        assert f'<td class="num">{floatformat(rating.low, 0)} – {floatformat(rating.high, 0)}</td>' in page


def test_the_leaderboard_page_shows_no_interval_for_votes_all_one_way(team, client_for, models, sent):
    """QA: five votes, all for falcon, showed each model a 95% interval of no width ("1249 – 1249")."""
    for number in range(MIN_VOTES_FOR_INTERVAL):
        battle = start_battle(team, client_for, prompt=f"Question {number}")
        finish(battle, "x", "y")
        arena.battle_vote(battle=battle, outcome="a" if battle.side_a.model_label == "Base model: falcon" else "b")
    ratings, _rates = arena.project_leaderboard(project=team.project)
    page = client_for(team.teammate).get(reverse("chat:leaderboard", args=[team.project.slug])).content.decode()
    assert page.count(">votes all one way<") == 2 and "too few votes" not in page
    for rating in ratings:
        assert f"{floatformat(rating.low, 0)} – {floatformat(rating.high, 0)}" not in page


def test_the_leaderboard_reads_the_votes_once_per_vote_however_many_there_are(team, client_for, models, sent):
    """Each load of the leaderboard read every vote of the project and fitted them (5,000 votes: 70 ms of its 95,
    bench/pages_at_scale.py). It is kept per vote state: a load after another reads no vote, in as many queries
    for 6 votes as for 2, and a new vote shows on the next load."""
    url = reverse("chat:leaderboard", args=[team.project.slug])
    client = client_for(team.teammate)
    counts = []
    for total in (2, 6):
        while Battle.objects.filter(project=team.project).exclude(outcome="").count() < total:
            battle = start_battle(team, client_for, prompt=f"Question {Battle.objects.count()}")
            finish(battle, "x", "y")
            arena.battle_vote(battle=battle, outcome="a" if battle.side_a.model_label == "Base model: falcon" else "b")
        assert f'<td class="num">{total}</td></tr>' in client.get(url).content.decode()  # each model in every vote
        with CaptureQueriesContext(connection) as queries:
            again = client.get(url).content.decode()
        assert again.index("Base model: falcon") < again.index("Base model: heron") and "100%" in again
        assert not [query["sql"] for query in queries if "model_label" in query["sql"]]  # no vote read
        counts.append(len(queries))
    assert counts[0] == counts[1]


def sorts_every_row(queryset) -> bool:
    """Whether the database's plan for ``queryset`` sorts the rows it finds (no index gives them in order). On
    PostgreSQL, sequential scans are turned off for the plan, so that a few rows' table is not read whole instead."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL enable_seqscan = off")  # until the test's transaction ends
        return "Sort" in queryset.explain()
    return "USE TEMP B-TREE FOR ORDER BY" in queryset.explain()


def battles_up_to(team, models, total: int, *, outcomes: tuple[str, ...] = (), user=None) -> None:
    """Bulk-made battles of ``user`` (the teammate by default) until the project has ``total``, each between the two
    ``models``; with ``outcomes``, the n-th battle's is ``outcomes[n % len(outcomes)]``."""
    from webapp.chat.models import Conversation

    user = user or team.teammate
    made = Battle.objects.filter(project=team.project).count()
    sides = Conversation.objects.bulk_create([
        Conversation(project=team.project, user=user, model_ref=model.public_id,
                     model_label=f"Base model: {model.name}", in_arena=True)
        for _ in range(made, total) for model in models])
    Battle.objects.bulk_create([
        Battle(project=team.project, user=user, prompt=f"Question {made + index}",
               side_a=sides[2 * index], side_b=sides[2 * index + 1],
               **({"outcome": outcomes[(made + index) % len(outcomes)]} if outcomes else {}))
        for index in range(total - made)])


def test_the_arena_lists_a_voters_latest_battles_without_sorting_all_of_them(team, client_for, models, sent):
    """The arena page's list of the voter's latest 50 battles sorted every battle of theirs in the project to find
    them (5,000 battles: 33 ms of the page's query time, bench/pages_at_scale.py): the (project, user, newest first)
    index gives them in order. The first page shows the 50 latest, in as many queries for 60 battles as for 3."""
    client = client_for(team.teammate)
    counts = []
    for total in (3, 60):
        battles_up_to(team, models, total)
        with CaptureQueriesContext(connection) as queries:
            page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
        counts.append(len(queries))
    newest = list(Battle.objects.filter(project=team.project).order_by("-created_at", "-id")[:50])
    assert all(battle.prompt in page for battle in newest) and page.count("Question ") == 50
    assert counts[0] == counts[1]
    assert not sorts_every_row(arena.battle_list(project=team.project, user=team.teammate)[:50])


def decisive_votes_shown(client, team) -> int:
    page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    return int(re.search(r"(\d+) decisive votes? in this project", page).group(1))


def test_the_arena_counts_its_decisive_votes(team, client_for, models, sent):
    """The arena's "N decisive votes": A and B count; a tie, both bad, a battle not voted, one whose answer failed and
    a deleted one do not."""
    from webapp.chat.models import Message, MessageStatus

    client = client_for(team.teammate)
    battles = {outcome: start_battle(team, client_for, prompt=f"Name a colour ({outcome}).")
               for outcome in ("a", "b", "tie", "both_bad", "failed", "deleted", "")}
    for outcome, battle in battles.items():
        finish(battle, "Blue.", "Red.")
        if outcome:
            client.post(battle_url("vote", battle), {"outcome": "a" if outcome in ("failed", "deleted") else outcome})
    assert decisive_votes_shown(client, team) == 4
    Message.objects.filter(pk=arena.battle_answer(battles["failed"].side_b).pk).update(status=MessageStatus.FAILED)
    assert decisive_votes_shown(client, team) == 3
    battles["deleted"].delete()
    assert decisive_votes_shown(client, team) == 2


def plan_of(sql: str) -> str:
    """The database's plan for ``sql``; on PostgreSQL with sequential and bitmap scans turned off, so that a few rows'
    table is not read whole, or through the index and then its rows, where the index alone would answer."""
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SET LOCAL enable_seqscan = off")  # until the test's transaction ends
            cursor.execute("SET LOCAL enable_bitmapscan = off")
            cursor.execute(f"EXPLAIN {sql}")
        else:
            cursor.execute(f"EXPLAIN QUERY PLAN {sql}")
        return "\n".join(" ".join(str(cell) for cell in row) for row in cursor.fetchall())


def test_the_arena_counts_its_decisive_votes_from_an_index_without_reading_battles(team, client_for, models, sent):
    """The arena's count of decisive votes checked every battle's two sides for a failed answer, two ``EXISTS`` on the
    messages per battle (18 ms at 5,000 battles, bench/pages_at_scale.py). It is one count read from the battles'
    (project, outcome, blind, side_a, side_b) index alone, the failed answers found once: as many queries for 60
    battles as for 3, no battle row read."""
    client = client_for(team.teammate)
    counts = []
    for total in (3, 60):
        battles_up_to(team, models, total, outcomes=("a", "b", "tie"))
        with CaptureQueriesContext(connection) as queries:
            assert decisive_votes_shown(client, team) == sum(1 for index in range(total) if index % 3 != 2)
        counts.append(len(queries))
    assert counts[0] == counts[1]
    count_sql = next(query["sql"] for query in queries.captured_queries
                     if "COUNT(" in query["sql"] and '"chat_battle"."outcome" IN' in query["sql"])
    plan = plan_of(count_sql)
    if connection.vendor == "postgresql":
        # PostgreSQL's choice among the battles' indexes follows its statistics of a table just filled (an index-only
        # scan needs a visibility map no VACUUM has written yet): the clean-clone CI's took (project, user) once.
        # What holds whatever it picks: the count is answered through an index, never a read of the whole table.
        assert "Index" in plan and "Seq Scan on chat_battle " not in plan + " ", plan
    else:
        assert "COVERING INDEX chat_battle_rated" in plan, plan


def test_a_battle_whose_answer_no_worker_will_finish_stops_waiting(team, client_for, models, sent, settings):
    """A serve worker that died left a side streaming for ever: the battle has no Stop, so its vote waited
    for good. Past the generation timeout and the queue's grace the page fails that answer (a recent one
    waits), and the battle, which can no longer be rated, offers its prompt again."""
    from datetime import timedelta

    from django.utils import timezone

    from webapp.chat.models import Message, MessageStatus

    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # the failure is kept though its event cannot be sent
    settings.TEMPER_SERVE_TIMEOUT_SECONDS = 30
    battle = start_battle(team, client_for)
    services.message_finish(message_id=arena.battle_answer(battle.side_a).public_id, text="Blue.", finish_reason="stop")
    client = client_for(team.teammate)
    page = client.get(battle_url("battle", battle)).content.decode()
    assert 'value="a" class="button" disabled' in page and "no serve worker finished" not in page
    lost = arena.battle_answer(battle.side_b)
    Message.objects.filter(pk=lost.pk).update(
        created_at=timezone.now() - timedelta(seconds=services.generation_expiry_seconds() + 1))
    page = client.get(battle_url("battle", battle)).content.decode()
    assert "no serve worker finished this answer" in page and "Answer B failed" in page
    assert 'name="outcome"' not in page and "Start a new battle with this prompt" in page
    assert Message.objects.get(pk=lost.pk).status == MessageStatus.FAILED
    client.post(battle_url("vote", battle), {"outcome": "a"})
    assert Battle.objects.get(pk=battle.pk).outcome == ""


def test_a_failed_answer_cannot_be_voted_on_and_old_such_votes_rate_nothing(team, client_for, models, sent):
    """A prompt over the context failed both answers, yet "B is better" was taken: the pair had two empty
    answers, so every later export of the project's votes failed validation, and the vote counted."""
    failed = start_battle(team, client_for, prompt="word " * 50)
    for side in (failed.side_a, failed.side_b):
        services.message_finish(message_id=arena.battle_answer(side).public_id, error="the prompt is too long")
    with pytest.raises(services.ChatError, match="answer A failed, so this battle cannot be rated"):
        arena.battle_vote(battle=failed, outcome="b")
    page = client_for(team.teammate).get(battle_url("battle", failed)).content.decode()
    assert 'name="outcome"' not in page
    again = page.split('class="arena-vote arena-failed"')[1].split("</form>")[0]
    assert f'name="prompt" value="{"word " * 50}"' in again and 'name="model_a"' not in again  # blind: no names
    # A vote recorded before this check (as the QA run's was) is left out of the pairs and the ratings.
    Battle.objects.filter(pk=failed.pk).update(outcome="b")
    good = start_battle(team, client_for)
    finish(good, "Blue.", "Seven.")
    arena.battle_vote(battle=good, outcome="a")
    assert [pair["prompt"] for pair in arena.preference_pairs(project=team.project)] == ["Name a colour."]
    assert [rating.votes for rating in arena.project_leaderboard(project=team.project)[0]] == [1, 1]
    from webapp.datasets.services import dataset_version_validate

    version = arena.arena_export(project=team.project, user=team.teammate, dataset_name="votes")
    version = dataset_version_validate(version_id=version.pk)
    assert version.status == "ready" and version.row_count == 1



def test_a_voted_battle_leads_to_the_next_one_and_the_leaderboard(team, client_for, models, sent):
    """QA: once voted, a battle's page said the vote and offered only a way back to the arena's form, where
    the prompt had to be typed again; the leaderboard the vote went to was not linked."""
    battle = start_battle(team, client_for, prompt="What is 7 + 5?")
    finish(battle, "12.", "13.")
    client = client_for(team.teammate)
    client.post(battle_url("vote", battle), {"outcome": "a"})
    page = client.get(battle_url("battle", battle)).content.decode()
    again = page.split('class="arena-vote arena-next"')[1].split("</form>")[0]
    assert 'name="prompt" value="What is 7 + 5?"' in again and 'name="model_a"' not in again  # blind: no names
    assert "Another battle with this prompt" in again
    assert f'href="{reverse("chat:leaderboard", args=[team.project.slug])}"' in page
    response = client.post(reverse("chat:arena", args=[team.project.slug]),
                           {"prompt": "What is 7 + 5?", TOKEN_FIELD: form_token(again)})
    assert response.status_code == 302
    assert Battle.objects.filter(project=team.project, prompt="What is 7 + 5?").count() == 2

def test_an_empty_answer_can_lose_a_vote_but_makes_no_pair(team, client_for, models, sent):
    battle = start_battle(team, client_for)
    finish(battle, "Blue.", "")
    arena.battle_vote(battle=battle, outcome="a")
    assert arena.preference_pairs(project=team.project) == []
    assert [rating.votes for rating in arena.project_leaderboard(project=team.project)[0]] == [1, 1]
    with pytest.raises(ValidationError, match="no decisive vote with two usable answers yet"):
        arena.arena_export(project=team.project, user=team.teammate, dataset_name="votes")


def test_two_runs_of_one_name_are_two_models(team, client_for, sent):
    """Two runs named alike were one row of the leaderboard (their votes added up) and read alike in the
    model picker, and a battle between them was left out."""
    from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus

    runs = [Run.objects.create(project=team.project, name="qa-bad", task="sft", status=RunStatus.SUCCEEDED,
                            spec={}, resolved_spec={})
            for _ in range(2)]
    for run in runs:
        Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, path=f"/runs/{run.public_id}/export")
    labels = [choice.label for choice in selectors.model_choices(project=team.project)]
    assert sorted(labels) == sorted(f"Run: qa-bad ({run.public_id})" for run in runs)
    battle = start_battle(team, client_for)
    finish(battle, "x", "y")
    arena.battle_vote(battle=battle, outcome="a")
    ratings, rates = arena.project_leaderboard(project=team.project)
    winner = battle.side_a.model_label
    assert [(rating.model, rating.votes) for rating in ratings] == [(winner, 1), (battle.side_b.model_label, 1)]
    assert rates[(winner, battle.side_b.model_label)] == (1.0, 1)
    page = client_for(team.teammate).get(reverse("chat:leaderboard", args=[team.project.slug])).content.decode()
    assert all(f"Run: qa-bad ({run.public_id})" in page for run in runs)


def test_it_requires_access(team, client_for, models, sent):
    battle = start_battle(team, client_for)
    for user in (team.outsider, team.owner):  # a battle is its voter's own
        client = client_for(user)
        assert client.get(battle_url("battle", battle)).status_code == 404
        assert client.post(battle_url("vote", battle), {"outcome": "a"}).status_code == 404
    assert client_for(team.outsider).get(reverse("chat:leaderboard", args=[team.project.slug])).status_code == 404
    assert client_for(team.viewer).get(reverse("chat:arena", args=[team.project.slug])).status_code == 403


def test_viewers_read_the_leaderboard(team, client_for, models, sent):
    """Viewers 'read everything in the project', yet the leaderboard, which spends nothing, answered them 403
    and no tab led to it. They read it now, from a Leaderboard tab, with no way into the arena itself."""
    battle = start_battle(team, client_for)
    finish(battle, "Blue.", "Red.")
    arena.battle_vote(battle=battle, outcome="a")
    response = client_for(team.viewer).get(reverse("chat:leaderboard", args=[team.project.slug]))
    assert response.status_code == 200
    page = response.content.decode()
    assert "Base model: falcon" in page and "Base model: heron" in page
    assert active_tabs(page) == ["Leaderboard"]
    assert f'href="{reverse("chat:arena", args=[team.project.slug])}"' not in page
    assert "New review campaign from arena votes" not in page
    member_page = client_for(team.teammate).get(reverse("chat:leaderboard", args=[team.project.slug])).content.decode()
    assert active_tabs(member_page) == ["Arena"]


def test_it_needs_two_models(team, client_for, sent):
    client, url = client_for(team.teammate), reverse("chat:arena", args=[team.project.slug])
    page = client.get(url).content.decode()
    assert "this project has none" in page and re.search(r'<button type="submit" class="button primary" disabled>', page)
    make_base_model(team.project, name="only", path="/models/only")
    page = client.get(url).content.decode()  # said before Battle is pressed, with where models come from
    assert "A battle needs two models, and this project has one, <bdi>Base model: only</bdi>" in page
    assert f'href="{reverse("basemodels:register", args=[team.project.slug])}"' in page
    assert f'href="{reverse("runs:new", args=[team.project.slug])}"' in page
    response = client.post(url, {"prompt": "Hi"})
    assert response.status_code == 400 and b"at least two models" in response.content
    make_base_model(team.project, name="second", path="/models/second")
    page = client.get(url).content.decode()
    assert "arena-needs-two-models" not in page and 'class="button primary">Battle' in page


def test_compare_mode_names_both_models_and_stays_off_the_leaderboard(team, client_for, models, sent,
                                                                     django_capture_on_commit_callbacks):
    client = client_for(team.teammate)
    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(reverse("chat:arena", args=[team.project.slug]), {
            "prompt": "Compare me.", "model_a": models[1].public_id, "model_b": models[0].public_id})
    assert response.status_code == 302
    battle = Battle.objects.get(prompt="Compare me.")
    assert not battle.blind and [request["model_path"] for request in sent] == ["/models/heron", "/models/falcon"]
    page = client.get(battle_url("battle", battle)).content.decode()
    assert "A: Base model: heron" in page and "B: Base model: falcon" in page
    finish(battle, "x", "y")
    arena.battle_vote(battle=battle, outcome="a")
    assert len(arena.preference_pairs(project=team.project)) == 1
    assert arena.project_leaderboard(project=team.project) == ([], {})
    same = client.post(reverse("chat:arena", args=[team.project.slug]), {
        "prompt": "Twice.", "model_a": models[0].public_id, "model_b": models[0].public_id})
    assert same.status_code == 400 and b"two different models" in same.content


def test_a_leaderboard_with_only_compare_mode_votes_says_why_it_is_empty(team, client_for, models, sent):
    """QA (second first-use pass): after a vote in compare mode the leaderboard said "No votes yet.", as if the
    vote were lost; that such votes are left out was in the paragraph above, and nothing said how to rank."""
    client = client_for(team.teammate)
    url = reverse("chat:leaderboard", args=[team.project.slug])
    assert "No votes yet." in client.get(url).content.decode()
    client.post(reverse("chat:arena", args=[team.project.slug]), {
        "prompt": "Compare me.", "model_a": models[1].public_id, "model_b": models[0].public_id})
    battle = Battle.objects.get(prompt="Compare me.")
    finish(battle, "x", "y")
    arena.battle_vote(battle=battle, outcome="a")
    page = client.get(url).content.decode()
    assert "No votes yet." not in page
    assert "No blind votes yet: the 1 vote cast in compare mode, with the models' names shown, is left out." in page
    arena_link = f'<a href="{reverse("chat:arena", args=[team.project.slug])}">Battle</a> with both models left at'
    assert arena_link in page
    # A viewer, who may not battle, reads why without the link.
    viewer_page = client_for(team.viewer).get(url).content.decode()
    assert "No blind votes yet" in viewer_page and arena_link not in viewer_page


def test_the_same_battle_sent_twice_asks_the_models_once(team, client_for, models, sent,
                                                         django_capture_on_commit_callbacks):
    client = client_for(team.teammate)
    page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    form = {"prompt": "Name a colour.",
            TOKEN_FIELD: form_token(page, after='id="new-battle"')}
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(reverse("chat:arena", args=[team.project.slug]), form)
        second = client.post(reverse("chat:arena", args=[team.project.slug]), form)
    battle = Battle.objects.get()
    assert first.status_code == second.status_code == 302 and first["Location"] == second["Location"] == battle_url(
        "battle", battle)
    assert len(sent) == 2  # one generation per side, once


def active_tabs(page: str) -> list[str]:
    subnav = page.split('<nav class="subnav"', 1)[1].split("</nav>", 1)[0]
    return re.findall(r'class="active" aria-current="page">([^<]+)</a>', subnav)


def test_the_arena_pages_light_the_arena_tab_alone(team, client_for, models, sent):
    """The arena's pages are served by the chat app, and both Chat and Arena were lit on them."""
    battle = start_battle(team, client_for)
    client = client_for(team.teammate)
    for url in (reverse("chat:arena", args=[team.project.slug]), reverse("chat:leaderboard", args=[team.project.slug]),
                battle_url("battle", battle)):
        assert active_tabs(client.get(url).content.decode()) == ["Arena"], url
    assert active_tabs(client.get(reverse("chat:list", args=[team.project.slug])).content.decode()) == ["Chat"]


def test_a_refused_battle_keeps_what_was_typed(team, client_for, models, sent):
    """The form came back empty after an error (one model picked in compare mode), the prompt lost."""
    response = client_for(team.teammate).post(reverse("chat:arena", args=[team.project.slug]), {
        "prompt": "A long prompt <b>kept</b>\nover two lines", "model_a": models[1].public_id, "model_b": ""})
    assert response.status_code == 400 and b"compare mode needs two models" in response.content
    page = response.content.decode()
    assert ('<textarea name="prompt" id="id_prompt" rows="3" maxlength="100000" required>A long prompt &lt;b&gt;kept&lt;/b&gt;\n'
            'over two lines</textarea>') in page
    assert f'<option value="{models[1].public_id}" selected>' in page.split('id="id_model_a"')[1].split("</select>")[0]
    assert " selected>" not in page.split('id="id_model_b"')[1].split("</select>")[0]


def test_it_rejects_a_prompt_longer_than_a_chat_message(team, client_for, models, sent):
    """A chat message stops at 100,000 characters; an arena prompt of any length was stored twice (the battle
    and both sides' turns) and sent to the models."""
    from webapp.chat.models import Conversation

    response = client_for(team.teammate).post(reverse("chat:arena", args=[team.project.slug]),
                                              {"prompt": "x" * 100_001})
    assert response.status_code == 400
    assert b"the prompt is 100,001 characters long; at most 100,000" in response.content
    assert not Battle.objects.exists() and not Conversation.objects.exists() and not sent
    assert start_battle(team, client_for, prompt="x" * 100_000).prompt == "x" * 100_000


def test_it_rejects_a_blank_prompt_as_bad_input(team, client_for, models, sent):
    """A prompt of white space was refused like a busy conversation; it is bad input, said as such."""
    response = client_for(team.teammate).post(reverse("chat:arena", args=[team.project.slug]), {"prompt": "  \n "})
    assert response.status_code == 400
    assert b"the prompt is empty or only white space; write something to send" in response.content
    assert not Battle.objects.exists() and not sent
    with pytest.raises(ValidationError) as refused:
        arena.battle_create(project=team.project, user=team.teammate, prompt=" ", choices=selectors.model_choices(
            project=team.project))
    assert list(refused.value.message_dict) == ["prompt"]


def test_a_prompts_line_breaks_reach_the_models_and_the_preference_pairs_as_typed(team, client_for, models, sent,
                                                                                django_capture_on_commit_callbacks):
    """The arena's form sends the prompt's line breaks as CRLF: both models read "\\r\\n", and the exported
    pairs' prompts carried it into the preference data trained on."""
    with django_capture_on_commit_callbacks(execute=True):
        response = client_for(team.teammate).post(reverse("chat:arena", args=[team.project.slug]),
                                                  {"prompt": "Name a colour\r\nin one word."})
    assert response.status_code == 302
    battle = Battle.objects.get(project=team.project, prompt="Name a colour\nin one word.")
    assert all(request["messages"] == [{"role": "user", "content": "Name a colour\nin one word."}] for request in sent)
    finish(battle, "Blue.", "Red.")
    client_for(team.teammate).post(battle_url("vote", battle), {"outcome": "a"})
    assert [row["prompt"] for row in arena.preference_pairs(project=team.project)] == ["Name a colour\nin one word."]


def test_battles_made_at_the_same_instant_keep_their_places_across_the_arenas_pages(team, client_for, models, sent):
    """The arena's list was ordered by creation time alone: battles made at the same instant (a bulk import, a clock
    of coarse resolution) had no order between them, so a page could repeat one and the next leave another out. Ties
    are broken by id, the newest made first, on every page."""
    from django.utils import timezone

    from webapp.chat.arena_views import BATTLES_PER_PAGE

    battles_up_to(team, models, BATTLES_PER_PAGE + 10)
    Battle.objects.filter(project=team.project).update(created_at=timezone.now())
    client = client_for(team.teammate)
    shown = []
    for number in (1, 2):
        page = client.get(reverse("chat:arena", args=[team.project.slug]), {"page": number})
        shown += [row["battle"].pk for row in page.context["battles"]]
    assert shown == sorted(Battle.objects.filter(project=team.project).values_list("pk", flat=True), reverse=True)
    assert not sorts_every_row(arena.battle_list(project=team.project, user=team.teammate)[:BATTLES_PER_PAGE])


def test_the_decisive_votes_counted_are_the_pairs_the_export_writes(team, client_for, models, sent):
    """The arena said "2 decisive votes" while its export wrote 1 pair: a decisive vote on an empty answer is no pair
    (a pair needs two texts). The count is the pairs the export writes, and the page says how many votes are left out
    and why."""
    client = client_for(team.teammate)
    for prompt, text_b in (("Name a colour.", "Red."), ("Name a fruit.", " \n")):
        battle = start_battle(team, client_for, prompt=prompt)
        finish(battle, "Blue.", text_b)
        client.post(battle_url("vote", battle), {"outcome": "a"})
    page = client.get(reverse("chat:arena", args=[team.project.slug])).content.decode()
    assert decisive_votes_shown(client, team) == len(arena.preference_pairs(project=team.project)) == 1
    assert ("1 more decisive vote is left out of the export and of review: its battle has an empty answer, and a "
            "preference pair needs two texts.") in page


def test_the_empty_answers_are_found_through_an_index_not_by_reading_every_answer(team, client_for, models, sent):
    """The arena's count of decisive votes found the empty answers by matching every arena answer of the project
    against a regular expression: 31 ms for 20,000 answers, run twice in the count (bench/arena_empty_answers.py). An
    answer records whether it has text as it is written (``Message.has_text``), and the few without are read through a
    partial index of them; the count stays exact."""
    from webapp.chat.models import Message

    client = client_for(team.teammate)
    for prompt, text_b in (("Name a colour.", "Red."), ("Name a fruit.", " \n"), ("Name a bird.", "\u3000\t")):
        battle = start_battle(team, client_for, prompt=prompt)
        finish(battle, "Blue.", text_b)
        client.post(battle_url("vote", battle), {"outcome": "a"})
    assert decisive_votes_shown(client, team) == len(arena.preference_pairs(project=team.project)) == 1
    assert sorted(Message.objects.filter(role="assistant").values_list("has_text", flat=True)) == [False, False] + [True] * 4
    with CaptureQueriesContext(connection) as queries:
        list(arena.empty_answer_conversations())
    plan = plan_of(queries.captured_queries[-1]["sql"])
    if connection.vendor == "postgresql":
        assert "Seq Scan on chat_message " not in plan + " ", plan
    else:
        assert "chat_message_no_text" in plan, plan
