"""Task modules, one per queue concern. Imported by the worker at start-up."""
from worker.tasks import datasets, review, train  # noqa: F401
