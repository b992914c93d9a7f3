"""docker-compose.yml and the Dockerfile (no Docker engine runs here): every
service, shared volume, health check and variable the deployment needs is named."""
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEMPER_SERVICES = {"web", "worker-default", "worker-train", "worker-serve"}
WORKER_QUEUES = {"worker-default": "default", "worker-train": "train", "worker-serve": "serve"}


def load_compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def command_text(service: dict) -> str:
    command = service["command"]
    return command if isinstance(command, str) else " ".join(command)


def test_it_names_every_service_with_a_health_check():
    services = load_compose()["services"]
    assert set(services) == {"postgres", "redis"} | TEMPER_SERVICES
    for name, service in services.items():
        assert service["healthcheck"]["test"], f"{name} has no health check"


def test_temper_services_share_data_and_configuration():
    compose = load_compose()
    assert {"data", "pgdata"} <= set(compose["volumes"])
    for name in TEMPER_SERVICES:
        service = compose["services"][name]
        environment = service["environment"]
        assert environment["DATABASE_URL"].startswith("postgres://") and "@postgres:5432/" in environment["DATABASE_URL"]
        assert environment["REDIS_URL"] == "redis://redis:6379/0"
        assert environment["TEMPER_DATA"] == "/data"
        assert "data:/data" in service["volumes"], f"{name} does not mount the shared data volume"
        assert service["build"] == "."


def test_start_order_waits_for_health():
    services = load_compose()["services"]
    assert services["web"]["depends_on"] == {
        "postgres": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
    }
    for name in WORKER_QUEUES:
        assert services[name]["depends_on"] == {"web": {"condition": "service_healthy"}}
    assert services["postgres"]["volumes"] == ["pgdata:/var/lib/postgresql/data"]


def test_each_process_runs_the_right_command():
    services = load_compose()["services"]
    web = command_text(services["web"])
    assert "manage.py migrate" in web and "temper_setup" in web and "uvicorn webapp.asgi:application" in web
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    for name, queue in WORKER_QUEUES.items():
        command = services[name]["command"]
        assert command[:4] == ["celery", "-A", "worker.celery", "worker"]
        assert command[command.index("-Q") + 1] == queue
    assert services["worker-train"]["command"][-2:] == ["--concurrency", "1"]


def test_dockerfile_copies_what_exists():
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "FROM python:3.11" in dockerfile
    copied = [
        source
        for line in dockerfile.splitlines()
        if line.startswith("COPY ")
        for source in line.split()[1:-1]
    ]
    assert {"webapp", "worker", "jaxengine", "templates", "static", "manage.py", "pyproject.toml"} <= set(copied)
    for source in copied:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"
