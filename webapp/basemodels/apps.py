from django.apps import AppConfig


class BasemodelsConfig(AppConfig):
    name = "webapp.basemodels"
    label = "basemodels"
