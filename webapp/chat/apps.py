from django.apps import AppConfig


class ChatConfig(AppConfig):
    name = "webapp.chat"
    label = "chat"
