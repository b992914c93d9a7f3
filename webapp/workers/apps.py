from django.apps import AppConfig


class WorkersConfig(AppConfig):
    name = "webapp.workers"
    label = "workers"
