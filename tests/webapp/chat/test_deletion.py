"""Deleting a chat conversation: only its author, from its page or the list; refused while an answer is
still being written; an arena battle's sides are not deleted here (the vote and leaderboard count them)."""
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.webapp.factories import form_token, make_base_model
from webapp.chat import arena, selectors, services
from webapp.chat.models import Battle, Conversation, Message
from webapp.core.bidi import isolated


@pytest.fixture
def model(team):
    make_base_model(team.project, name="tiny", path="/models/tiny")
    return selectors.model_choices(project=team.project)[0]


def url(conversation, suffix=""):
    return f"/p/alpha/chat/{conversation.public_id}/{suffix}"


def answered(team, model, *, text="What is 2 + 2?"):
    """A conversation of the teammate's with one turn and its finished answer."""
    conversation = services.conversation_create(project=team.project, user=team.teammate, model=model)
    answer = services.message_send(conversation=conversation, model=model, content=text)
    services.message_finish(message_id=answer.public_id, text="4", finish_reason="stop")
    conversation.refresh_from_db()
    return conversation


def delete_from(client, page_url, conversation, capture):
    page = client.get(page_url).content.decode()
    with capture(execute=True):
        return client.post(url(conversation, "delete/"),
                           {"submission_token": form_token(page, after=url(conversation, "delete/"))})


def test_its_author_deletes_a_conversation_from_its_page(team, model, client_for, sent,
                                                         django_capture_on_commit_callbacks):
    conversation = answered(team, model)
    client = client_for(team.teammate)
    response = delete_from(client, url(conversation), conversation, django_capture_on_commit_callbacks)
    assert response.status_code == 302 and response["Location"] == "/p/alpha/chat/"
    assert not Conversation.objects.filter(pk=conversation.pk).exists() and not Message.objects.exists()
    assert f"Deleted the conversation {isolated('What is 2 + 2?')}." in client.get("/p/alpha/chat/").content.decode()
    assert client.get(url(conversation)).status_code == 404


def test_a_second_sending_of_the_form_lands_where_the_first_did(team, model, client_for, sent,
                                                                 django_capture_on_commit_callbacks):
    conversation = answered(team, model)
    client = client_for(team.teammate)
    token = form_token(client.get(url(conversation)).content.decode(), after=url(conversation, "delete/"))
    with django_capture_on_commit_callbacks(execute=True):
        first = client.post(url(conversation, "delete/"), {"submission_token": token})
        second = client.post(url(conversation, "delete/"), {"submission_token": token})
    assert first["Location"] == second["Location"] == "/p/alpha/chat/"


def test_its_author_deletes_a_conversation_from_the_list(team, model, client_for, sent,
                                                         django_capture_on_commit_callbacks):
    kept = answered(team, model, text="keep me")
    gone = answered(team, model, text="drop me")
    response = delete_from(client_for(team.teammate), "/p/alpha/chat/", gone, django_capture_on_commit_callbacks)
    assert response["Location"] == "/p/alpha/chat/"
    assert list(Conversation.objects.all()) == [kept]


def test_only_its_author_may_delete_a_conversation(team, model, client_for, sent):
    """Conversations are private: another member, even an owner, gets 404, as does an outsider; a viewer
    (who cannot chat) 403."""
    conversation = answered(team, model)
    assert client_for(team.owner).post(url(conversation, "delete/")).status_code == 404
    assert client_for(team.outsider).post(url(conversation, "delete/")).status_code == 404
    assert client_for(team.viewer).post(url(conversation, "delete/")).status_code == 403
    assert Conversation.objects.filter(pk=conversation.pk).exists()


def test_a_conversation_is_not_deleted_while_an_answer_is_being_written(team, model, client_for, sent,
                                                                        django_capture_on_commit_callbacks):
    conversation = services.conversation_create(project=team.project, user=team.teammate, model=model)
    answer = services.message_send(conversation=conversation, model=model, content="Tell me a story")
    client = client_for(team.teammate)
    response = delete_from(client, url(conversation), conversation, django_capture_on_commit_callbacks)
    assert response["Location"] == url(conversation)
    assert ("Nothing was deleted: an answer is still being written; stop it or wait for it to finish."
            in client.get(url(conversation)).content.decode())
    assert Conversation.objects.filter(pk=conversation.pk).exists()

    # An answer no worker will finish any more does not hold the conversation.
    Message.objects.filter(pk=answer.pk).update(created_at=timezone.now() - timedelta(days=1))
    services.conversation_delete(conversation=conversation)
    assert not Conversation.objects.filter(pk=conversation.pk).exists()


def test_an_arena_battles_sides_are_not_deleted_from_the_chat(team, model, client_for, sent):
    make_base_model(team.project, name="other", path="/models/other")
    battle = arena.battle_create(project=team.project, user=team.teammate, prompt="Hi",
                                 choices=selectors.model_choices(project=team.project)[:2])
    side = battle.side_a
    assert client_for(team.teammate).post(url(side, "delete/")).status_code == 404
    with pytest.raises(Exception, match="a side of an arena battle"):
        services.conversation_delete(conversation=side)
    assert Battle.objects.filter(pk=battle.pk).exists()
