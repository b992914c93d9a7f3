"""``default`` queue tasks for datasets: validation, token statistics, the late counts of older versions, and
the files of derived versions (splits, dedupes, decontaminations). Thin: ids in, a service call, nothing returned
(results live in the database)."""
from __future__ import annotations

from webapp.celery import app
from webapp.datasets import services
from webapp.review import services as review_services


@app.task(name="worker.tasks.datasets.validate_dataset_version", acks_late=True)
def validate_dataset_version(version_id: int) -> None:
    """Validate a stored dataset version (safe to redeliver: settled versions are left alone), then give
    a review campaign's export that wrote it the outcome."""
    services.dataset_version_validate(version_id=version_id)
    review_services.export_settle(version_id=version_id)


@app.task(name="worker.tasks.datasets.compute_token_statistics", acks_late=True)
def compute_token_statistics(version_id: int, base_model_id: int) -> None:
    """Token-length statistics of a ready version with a base model's tokenizer."""
    services.token_statistics_compute(version_id=version_id, base_model_id=base_model_id)


@app.task(name="worker.tasks.datasets.count_turn_splits", acks_late=True)
def count_turn_splits(version_id: int) -> None:
    """The turn splits of a version validated before they were counted, for its page (safe to redeliver: a version
    counted already is left alone)."""
    services.turn_splits_count(version_id=version_id)


@app.task(name="worker.tasks.datasets.count_prompt_read_once", acks_late=True)
def count_prompt_read_once(version_id: int) -> None:
    """The rows read with their prompt once (and the statistics they change) of a preference version validated
    before such rows were so read, for its page (safe to redeliver: a version counted already is left alone)."""
    services.prompt_read_once_count(version_id=version_id)


@app.task(name="worker.tasks.datasets.derive_dataset_version", acks_late=True)
def derive_dataset_version(*version_ids: int | None) -> None:
    """Write the files of a derivation (a split's two sides, or one new version) and queue their checks (safe to
    redeliver: versions written or settled are left alone)."""
    services.dataset_derivation_write(version_ids=list(version_ids))
