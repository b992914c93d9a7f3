from django.apps import AppConfig


class EvalsConfig(AppConfig):
    name = "webapp.evals"
    label = "evals"
