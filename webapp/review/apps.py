from django.apps import AppConfig


class ReviewConfig(AppConfig):
    name = "webapp.review"
    label = "review"
