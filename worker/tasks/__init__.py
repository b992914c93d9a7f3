"""Task modules, one per queue concern. Imported by the worker at start-up."""
