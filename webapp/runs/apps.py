from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"

    def ready(self) -> None:
        from webapp.core.metrics import register_job_model
        from webapp.runs.models import Run

        # /metrics: temper_jobs{kind="run", state=queued|running|succeeded|failed|cancelled}
        register_job_model(kind="run", model=Run, state_field="status")
