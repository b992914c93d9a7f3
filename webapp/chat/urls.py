from django.urls import path

from webapp.chat import arena_views, events, openai_api, views

app_name = "chat"

urlpatterns = [
    path("v1/models", openai_api.models, name="v1_models"),
    path("v1/models/<path:model_id>", openai_api.model, name="v1_model"),
    path("v1/chat/completions", openai_api.chat_completions, name="v1_chat_completions"),
    path("v1/completions", openai_api.completions, name="v1_completions"),
    path("p/<slug:slug>/chat/", views.chat_list, name="list"),
    path("p/<slug:slug>/chat/tokens/", views.chat_token_create, name="token_create"),
    path("p/<slug:slug>/chat/tokens/<int:token_id>/revoke/", views.chat_token_revoke, name="token_revoke"),
    path("p/<slug:slug>/arena/", arena_views.arena_home, name="arena"),
    path("p/<slug:slug>/arena/leaderboard/", arena_views.arena_leaderboard, name="leaderboard"),
    path("p/<slug:slug>/arena/export/", arena_views.arena_export, name="arena_export"),
    path("p/<slug:slug>/arena/to-review/", arena_views.arena_to_review, name="arena_to_review"),
    path("p/<slug:slug>/arena/review-campaign/", arena_views.arena_review_create, name="arena_review_create"),
    path("p/<slug:slug>/arena/<str:battle_id>/", arena_views.arena_battle, name="battle"),
    path("p/<slug:slug>/arena/<str:battle_id>/vote/", arena_views.arena_vote, name="vote"),
    path("p/<slug:slug>/chat/<str:conversation_id>/", views.chat_detail, name="detail"),
    path("p/<slug:slug>/chat/<str:conversation_id>/delete/", views.chat_delete, name="delete"),
    path("p/<slug:slug>/chat/<str:conversation_id>/send/", views.chat_send, name="send"),
    path("p/<slug:slug>/chat/<str:conversation_id>/regenerate/", views.chat_regenerate, name="regenerate"),
    path("p/<slug:slug>/chat/<str:conversation_id>/messages/<str:message_id>/", views.chat_message, name="message"),
    path("p/<slug:slug>/chat/<str:conversation_id>/messages/<str:message_id>/stop/", views.chat_stop, name="stop"),
    path("p/<slug:slug>/chat/<str:conversation_id>/messages/<str:message_id>/events/", events.message_events,
         name="events"),
]
