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
    # Temper reads X-Forwarded-For itself, from TEMPER_TRUSTED_PROXIES only; uvicorn would believe it from its own
    # host (127.0.0.1, or FORWARDED_ALLOW_IPS) before Temper saw the request.
    assert "uvicorn webapp.asgi:application --host 0.0.0.0 --port 8000 --no-proxy-headers" in web
    assert "/healthz" in " ".join(services["web"]["healthcheck"]["test"])
    for name, queue in WORKER_QUEUES.items():
        command = services[name]["command"]
        assert command[:4] == ["celery", "-A", "worker.celery", "worker"]
        assert command[command.index("-Q") + 1] == queue
    train = services["worker-train"]["command"]
    assert train[train.index("--concurrency") + 1] == "1"


def test_every_train_worker_runs_a_fresh_process_per_job():
    """The default pool takes multi-host jobs like any other, and a process stays in the jax.distributed
    group it joined: QA 2026-12-04, after a 2-host run on pool default, every later run on those workers
    failed ("hosts: the spec asks for 1 processes, this job has 2") until they were restarted."""
    import re

    train = load_compose()["services"]["worker-train"]["command"]
    assert train[train.index("--max-tasks-per-child") + 1] == "1"
    [options] = re.findall(r"^start_worker train train 1 (.*)$", (ROOT / "scripts/up.sh").read_text(), re.M)
    assert options.split() == ["prefork", "--max-tasks-per-child", "1"]


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
    [command] = [line for line in dockerfile.splitlines() if line.startswith("CMD ")]
    assert '"uvicorn"' in command and '"--no-proxy-headers"' in command
    for source in copied:
        assert (ROOT / source).exists(), f"Dockerfile copies {source}, which does not exist"


def test_the_image_has_the_postgresql_client_of_the_compose_server():
    """temper_backup runs pg_dump in the web image, which refuses a server of a newer major version than its own:
    Debian bookworm's client (15) against the compose file's postgres:16 would refuse every backup."""
    import re

    [server] = re.findall(r"^postgres:(\d+)", load_compose()["services"]["postgres"]["image"])
    dockerfile = (ROOT / "Dockerfile").read_text()
    [client] = re.findall(r"^ARG POSTGRES_CLIENT_VERSION=(\d+)$", dockerfile, re.M)
    assert client == server
    assert '"postgresql-client-$POSTGRES_CLIENT_VERSION"' in dockerfile


# ---- docker-compose.multihost.yml: a two-host pool for multi-host jobs ----------------------------


def load_multihost() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.multihost.yml").read_text())


def test_the_multihost_pool_has_two_hosts_of_one_pool_queue():
    services = load_multihost()["services"]
    assert set(services) == {"worker-host-0", "worker-host-1"}
    commands = [service["command"] for service in services.values()]
    assert commands[0] == commands[1]
    command = commands[0]
    assert command[:4] == ["celery", "-A", "worker.celery", "worker"]
    queue = command[command.index("-Q") + 1]
    assert queue.startswith("train-")  # a pool's queue (webapp.runs.placement.pool_queue)
    # One job per worker and a fresh process per job: a process joins one jax.distributed group.
    assert command[command.index("--pool") + 1] == "prefork"
    assert command[command.index("--concurrency") + 1] == "1"
    assert command[command.index("--max-tasks-per-child") + 1] == "1"
    for name, service in services.items():
        assert service["healthcheck"]["test"], f"{name} has no health check"
        assert f"-d {queue}@$$HOSTNAME" in service["healthcheck"]["test"][1]


def test_each_pool_host_announces_its_own_address_and_a_coordinator_port():
    from webapp.runs.placement import pool_of_queues

    services = load_multihost()["services"]
    addresses = {service["environment"]["TEMPER_WORKER_ADDRESS"] for service in services.values()}
    assert len(addresses) == 2 and all(address.startswith("${HOST_") for address in addresses)
    for service in services.values():
        environment = service["environment"]
        assert int(environment["TEMPER_COORDINATOR_PORT"]) > 1024
        assert int(environment["TEMPER_HOST_LOST_SECONDS"]) < 60  # peers stop within a minute
        assert environment["DATABASE_URL"].startswith("${DATABASE_URL:?")  # the main host's, required
        assert environment["REDIS_URL"].startswith("${REDIS_URL:?")
        assert environment["TEMPER_DATA"] == "/data" and "data:/data" in service["volumes"]
        assert service["network_mode"] == "host"  # coordinator and collectives open ports between hosts
        command = service["command"]
        assert pool_of_queues([command[command.index("-Q") + 1]]) == "tpu"


def test_the_pool_shares_one_data_root():
    volume = load_multihost()["volumes"]["data"]
    assert volume["driver_opts"]["type"] == "nfs"  # checkpoints are written by every host together


def test_the_serve_worker_takes_as_many_chats_as_a_batch_has_rows():
    """It took 16 (Celery threads), while a batch has 64 rows: the 17th chat waited in the queue for a whole
    answer to end before its first token. Each thread only waits on its answer."""
    import inspect
    import re

    from jaxengine.serving import BatchDecoder

    rows = inspect.signature(BatchDecoder).parameters["max_slots"].default
    command = load_compose()["services"]["worker-serve"]["command"]
    assert command[command.index("--concurrency") + 1] == str(rows)
    [started] = re.findall(r"^start_worker serve serve (\d+) threads", (ROOT / "scripts/up.sh").read_text(), re.M)
    assert started == str(rows)


def load_multihost_main() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.multihost-main.yml").read_text())


def test_the_main_host_shares_the_pools_data_root_and_lets_it_reach_postgres_and_redis():
    """The pool's workers read the datasets and models the web app stored and write the run directories it
    serves, and use its Postgres and Redis: docker-compose.yml alone keeps a local data volume and no
    published port, so a pool set up by the docs alone could not find a run's dataset (QA 2026-12-04)."""
    main = load_compose()
    override = load_multihost_main()
    assert override["volumes"]["data"] == load_multihost()["volumes"]["data"]  # one NFS data root
    assert set(override["services"]) == {"postgres", "redis"} and set(override["services"]) <= set(main["services"])
    for name, port in (("postgres", 5432), ("redis", 6379)):
        [published] = override["services"][name]["ports"]
        address, host_port, container_port = published.rsplit(":", 2)
        assert address.startswith("${TEMPER_PRIVATE_ADDRESS:?")  # required, and never every interface
        assert int(host_port) == int(container_port) == port
    pool_environment = load_multihost()["services"]["worker-host-0"]["environment"]
    assert "5432" in pool_environment["DATABASE_URL"] and "6379" in pool_environment["REDIS_URL"]
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "docker compose -f docker-compose.yml -f docker-compose.multihost-main.yml up -d --build" in readme


def test_temper_services_take_the_reverse_proxy_settings_from_the_env_file():
    """The README's 'Behind a reverse proxy' asks for TEMPER_HTTPS=1 with HTTPS at the proxy: Compose passed
    TEMPER_TRUSTED_PROXIES on but not TEMPER_HTTPS or TEMPER_HSTS_SECONDS, so in a .env they did nothing (plain
    cookies, no request read as secure)."""
    services = load_compose()["services"]
    for name in TEMPER_SERVICES:
        environment = services[name]["environment"]
        assert environment["TEMPER_TRUSTED_PROXIES"] == "${TEMPER_TRUSTED_PROXIES:-}"
        assert environment["TEMPER_HTTPS"] == "${TEMPER_HTTPS:-0}"
        assert environment["TEMPER_HSTS_SECONDS"] == "${TEMPER_HSTS_SECONDS:-0}"
