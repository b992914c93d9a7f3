"""Temper's Django project. The Celery app lives here too (see ``webapp.celery``)."""
from webapp.celery import app as celery_app

__all__ = ["celery_app"]
