"""Conversations with a model, private to the user who started them, inside one project; arena battles.

A conversation keeps its model reference (``bm_…`` a base model, ``run_…`` a succeeded run's
export, ``run_…:step-N`` an exported checkpoint) and its settings; every turn is a ``Message``. An
assistant message is ``streaming`` while the serve worker generates it, then ``complete``,
``stopped`` (the user pressed stop), ``timeout`` or ``failed`` (``error`` says why).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.core.ids import PUBLIC_ID_MAX_LENGTH, new_public_id
from webapp.projects.models import Project


def new_conversation_id() -> str:
    return new_public_id("conv")


def new_message_id() -> str:
    return new_public_id("msg")


class Conversation(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_conversation_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="conversations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="conversations")
    title = models.CharField(max_length=200, blank=True)
    model_ref = models.CharField(max_length=100)
    model_label = models.CharField(max_length=300)
    system_prompt = models.TextField(blank=True)
    temperature = models.FloatField(default=0.7)
    top_p = models.FloatField(default=1.0)
    top_k = models.PositiveIntegerField(default=0)
    max_tokens = models.PositiveIntegerField(default=256)
    # OpenAI's, as /v1 takes them: penalties of tokens already generated, and text that ends an answer.
    presence_penalty = models.FloatField(default=0.0)
    frequency_penalty = models.FloatField(default=0.0)
    stop = models.JSONField(default=list, blank=True)  # up to 4 non-empty strings
    # The Thinking switch, for a model whose chat template reads enable_thinking (Qwen3's): sent as that template
    # variable. Null: the model's template does not read it, and nothing is sent.
    enable_thinking = models.BooleanField(null=True, default=None)
    # The other variables of the model's chat template set for this conversation ({"persona": "a pirate"}), sent over
    # the model's own with each turn: only names the template reads, JSON scalars (services.checked_template_variables).
    template_variables = models.JSONField(default=dict, blank=True)
    # One side of an arena battle: hidden from the conversation list and page (its model is secret).
    in_arena = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-updated_at"]
        indexes = [models.Index(fields=["project", "user", "-updated_at"], name="chat_conv_project_user")]


class Role(models.TextChoices):
    USER = "user", "User"
    ASSISTANT = "assistant", "Assistant"


class MessageStatus(models.TextChoices):
    STREAMING = "streaming", "Streaming"
    COMPLETE = "complete", "Complete"
    STOPPED = "stopped", "Stopped"
    TIMEOUT = "timeout", "Timed out"
    FAILED = "failed", "Failed"


class Message(models.Model):
    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_message_id)
    conversation = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="messages")
    role = models.CharField(max_length=10, choices=Role.choices)
    content = models.TextField(blank=True)
    # Whether ``content`` holds text (not empty, not only whitespace), written with it (``services.has_text``): the
    # arena finds its empty answers, whose votes make no preference pair, through the index of those without, not by
    # matching every answer's text. False until known, so a row written elsewhere is judged by its text.
    has_text = models.BooleanField(default=False)
    status = models.CharField(max_length=10, choices=MessageStatus.choices, default=MessageStatus.COMPLETE)
    error = models.TextField(blank=True)
    completion_tokens = models.PositiveIntegerField(default=0)
    first_token_seconds = models.FloatField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        # The failed answers' conversations, which the arena's count of rated battles leaves out (arena.rated_battles).
        indexes = [models.Index(fields=["status", "conversation"], name="chat_message_status"),
                   # The few messages without text (an answer empty or still streaming): arena.empty_answer_conversations.
                   models.Index(fields=["conversation"], condition=models.Q(has_text=False), name="chat_message_no_text")]


def new_battle_id() -> str:
    return new_public_id("arena")


class BattleOutcome(models.TextChoices):
    A = "a", "A is better"
    B = "b", "B is better"
    TIE = "tie", "Tie"
    BOTH_BAD = "both_bad", "Both are bad"


def protect_voted_battles(collector, field, sub_objs, using) -> None:
    """``Battle.user``'s deletion rule: a battle the account voted on is the team's (a vote counts in the
    leaderboard and the preference pairs, and means nothing without who gave it), so ``ProtectedError`` names
    those battles and the admin lists them and deletes nothing: deactivate the account instead. A battle never
    voted on is only its author's and goes with the account, as its two sides (the author's conversations) do."""
    # ``sub_objs`` holds only primary keys (the collector defers the rest): read the rows anew.
    battles = Battle.objects.using(using).filter(pk__in=[battle.pk for battle in sub_objs])
    voted = list(battles.exclude(outcome=""))
    if voted:
        raise models.ProtectedError("the arena battles an account voted on cannot be deleted", voted)
    models.CASCADE(collector, field, sub_objs, using)


class Battle(models.Model):
    """An arena battle: one prompt answered by two models drawn at random, shown as A and B; the
    names are revealed once the user votes. A decisive vote (A or B) is a preference pair."""

    public_id = models.CharField(max_length=PUBLIC_ID_MAX_LENGTH, unique=True, default=new_battle_id)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="battles")
    # An account that has voted in the arena cannot be deleted (deactivated, it stays): votes are the team's
    # leaderboard and preference pairs, and its two sides are the battle's conversations.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=protect_voted_battles, related_name="battles")
    prompt = models.TextField()
    side_a = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    side_b = models.ForeignKey(Conversation, on_delete=models.CASCADE, related_name="+")
    outcome = models.CharField(max_length=10, choices=BattleOutcome.choices, blank=True)
    # False for compare mode: the user picked both models and sees their names from the start; such
    # votes are preference pairs but stay off the (blind) leaderboard.
    blind = models.BooleanField(default=True)
    voted_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Ties of creation time (a bulk import, a coarse clock) broken by id, so that pages neither repeat nor skip one.
        ordering = ["-created_at", "-id"]
        # The arena page's list: a voter's latest battles in the project, without sorting every battle of theirs.
        indexes = [models.Index(fields=["project", "user", "-created_at", "-id"], name="chat_battle_project_user"),
                   # The arena's count of decisive votes (arena.rated_battles), read from the index alone.
                   models.Index(fields=["project", "outcome", "blind", "side_a", "side_b"], name="chat_battle_rated")]

    def __str__(self) -> str:
        return f"arena battle {self.public_id}"


class ProjectToken(models.Model):
    """A bearer token for the OpenAI-compatible API (``/v1/``), scoped to one project: it reaches that
    project's chat models and nothing else, as its user while they are a member of the project. Only a
    SHA-256 digest is stored; the token itself is shown once."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="project_tokens")
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    digest = models.CharField(max_length=64, unique=True)
    prefix = models.CharField(max_length=12)
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="From then on the token is refused; empty: "
                                                                       "it works until revoked.")

    class Meta:
        ordering = ["-created_at"]


class ApiGeneration(models.Model):
    """A ``/v1`` completion being answered (``webapp.chat.openai_api``): saved, under the lock of its model's row
    (``services.api_generation_start``), before its request is queued, and deleted once its answer ends, so that a
    deletion of the model (or of the project) is refused while it is answered, as while a chat answer streams.
    One its view could not delete (the process died) holds nothing once ``services.answer_is_lost`` would give up
    a chat answer that old."""

    # The completion's id as its client sees it (``chatcmpl-…``, ``cmpl-…``).
    public_id = models.CharField(max_length=64, unique=True)
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="api_generations")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    token_name = models.CharField(max_length=100)
    model_ref = models.CharField(max_length=100)
    created_at = models.DateTimeField(auto_now_add=True)
