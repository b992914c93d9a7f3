from django.apps import AppConfig


class ActivityConfig(AppConfig):
    name = "webapp.activity"
    label = "activity"
