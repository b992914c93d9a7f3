"""Task modules, one per queue concern. Imported by the worker at start-up."""
from worker.tasks import datasets, evals, review, serve, storage, train, webhooks  # noqa: F401
