"""Lookups of chat objects for a request. Chatting spends accelerator time, so it takes the member
role: viewers get 403 and outsiders 404; conversations are private to their author, so another
member's conversation or message is a 404 too."""
from __future__ import annotations

from django.http import Http404

from webapp.chat.models import Conversation, Message
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Membership, Project, Role


def chat_access(user, slug: str) -> tuple[Project, Membership]:
    return get_project_for_user(user, slug, min_role=Role.MEMBER)


def get_conversation_for_user(user, slug: str, conversation_id: str) -> tuple[Project, Membership, Conversation]:
    project, membership = chat_access(user, slug)
    conversation = Conversation.objects.filter(project=project, user=user, public_id=conversation_id).first()
    if conversation is None:
        raise Http404("no such conversation")
    return project, membership, conversation


def get_message_for_user(user, slug: str, conversation_id: str, message_id: str
                         ) -> tuple[Project, Conversation, Message]:
    project, _membership, conversation = get_conversation_for_user(user, slug, conversation_id)
    message = conversation.messages.filter(public_id=message_id).first()
    if message is None:
        raise Http404("no such message in this conversation")
    return project, conversation, message
