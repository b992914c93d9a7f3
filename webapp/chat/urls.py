from django.urls import path

from webapp.chat import events, views

app_name = "chat"

urlpatterns = [
    path("p/<slug:slug>/chat/", views.chat_list, name="list"),
    path("p/<slug:slug>/chat/<str:conversation_id>/", views.chat_detail, name="detail"),
    path("p/<slug:slug>/chat/<str:conversation_id>/send/", views.chat_send, name="send"),
    path("p/<slug:slug>/chat/<str:conversation_id>/regenerate/", views.chat_regenerate, name="regenerate"),
    path("p/<slug:slug>/chat/<str:conversation_id>/messages/<str:message_id>/", views.chat_message, name="message"),
    path("p/<slug:slug>/chat/<str:conversation_id>/messages/<str:message_id>/stop/", views.chat_stop, name="stop"),
    path("p/<slug:slug>/chat/<str:conversation_id>/messages/<str:message_id>/events/", events.message_events,
         name="events"),
]
