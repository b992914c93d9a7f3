"""Task modules, one per queue concern. Imported by the worker at start-up."""
from worker.tasks import datasets, train  # noqa: F401
