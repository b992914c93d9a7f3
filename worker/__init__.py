"""Celery workers: the only bridge between the web app and the engine.

Tasks are thin: they take ids, load rows, call a web service or an engine entry
point, and report back. Start one with ``celery -A worker worker -Q default``.
"""
from webapp.celery import app

__all__ = ["app"]
