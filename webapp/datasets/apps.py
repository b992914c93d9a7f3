from django.apps import AppConfig


class DatasetsConfig(AppConfig):
    name = "webapp.datasets"
    label = "datasets"

    def ready(self) -> None:
        from webapp.core.metrics import register_job_model
        from webapp.datasets.models import DatasetVersion

        # /metrics: temper_jobs{kind="dataset", state=uploaded|validating|ready|failed}
        register_job_model(kind="dataset", model=DatasetVersion, state_field="status")
