"""``/metrics``: access rule and content."""
import ipaddress
import shutil
import socket
import subprocess
import time
from datetime import timedelta

import pytest
import redis
from django.utils import timezone

from webapp.core.metrics import REQUEST_DURATION, register_job_model
from webapp.env import env_networks
from webapp.projects.models import Membership
from webapp.workers.models import Worker
from webapp.workers.services import worker_heartbeat_record

URL = "/metrics"


@pytest.fixture(autouse=True)
def _this_host_may_read(settings):
    """The content tests read from the test client's address, 127.0.0.1, listed as a scraper's would be."""
    settings.TEMPER_METRICS_ALLOW = (ipaddress.ip_network("127.0.0.1"),)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def redis_url(settings, tmp_path):
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs it from Debian packages)")
    port = free_port()
    process = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(tmp_path)],
        stdout=subprocess.DEVNULL,
    )
    client = redis.Redis(port=port)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        settings.REDIS_URL = f"redis://127.0.0.1:{port}/0"
        yield client
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)


def sample(body: str, line_start: str) -> float:
    for line in body.splitlines():
        if line.startswith(line_start + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no sample {line_start!r} in:\n{body}")


def beat(name, pid=1):
    worker_heartbeat_record(
        name=name, host="h", pid=pid, queues=["default"], devices={}, current_jobs=[], started_at=timezone.now()
    )


def test_it_works(client, db, redis_url, only_this_tests_workers):
    redis_url.lpush("train", "job-1", "job-2")
    redis_url.lpush("default", "job-3")
    beat("default@a")
    beat("train@b")
    Worker.objects.filter(name="train@b").update(last_seen=timezone.now() - timedelta(minutes=2))
    client.get("/healthz")
    response = client.get(URL)
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    body = response.content.decode()
    assert sample(body, "temper_redis_up") == 1
    assert sample(body, 'temper_queue_depth{queue="train"}') == 2
    assert sample(body, 'temper_queue_depth{queue="default"}') == 1
    assert sample(body, 'temper_queue_depth{queue="serve"}') == 0
    assert sample(body, "temper_workers_alive") == 1
    assert sample(body, 'temper_workers{state="stale"}') == 1
    healthz = 'temper_http_request_duration_seconds_count{method="GET",route="healthz",status="200"}'
    assert sample(body, healthz) >= 1


def test_it_counts_jobs_by_state(client, team, settings, monkeypatch):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    # Memberships stand in for a job model: three rows in three "states" (roles).
    monkeypatch.setattr("webapp.core.metrics._job_models", [])
    register_job_model(kind="membership", model=Membership, state_field="role")
    body = client.get(URL).content.decode()
    assert sample(body, 'temper_jobs{kind="membership",state="owner"}') == 2  # alpha and alpha-elsewhere
    assert sample(body, 'temper_jobs{kind="membership",state="viewer"}') == 1


def test_it_reports_redis_down(client, db, settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    body = client.get(URL).content.decode()
    assert sample(body, "temper_redis_up") == 0
    assert "temper_queue_depth{" not in body


def test_it_requires_access(client, db, settings):
    settings.TEMPER_METRICS_TOKEN = "s3cret"
    settings.TEMPER_METRICS_ALLOW = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("::1"))
    remote = {"REMOTE_ADDR": "192.168.1.2"}
    response = client.get(URL, **remote)
    assert response.status_code == 403
    assert response.content.decode() == (
        "metrics are readable with 'Authorization: Bearer <TEMPER_METRICS_TOKEN>', or from an address listed in "
        "TEMPER_METRICS_ALLOW (this request came from 192.168.1.2); set either where Temper runs\n")
    assert client.get(URL, headers={"Authorization": "Bearer wrong"}, **remote).status_code == 403
    assert client.get(URL, headers={"Authorization": "s3cret"}, **remote).status_code == 403
    # A header outside ASCII was a 500: compare_digest refuses such a str.
    assert client.get(URL, headers={"Authorization": "Bearer s3cr\u00e9t"}, **remote).status_code == 403
    assert client.get(URL, REMOTE_ADDR="127.0.0.1").status_code == 403  # not listed: a local proxy's address
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    assert client.get(URL, headers={"Authorization": "Bearer s3cret"}, **remote).status_code == 200
    assert client.get(URL, REMOTE_ADDR="10.1.2.3").status_code == 200
    assert client.get(URL, REMOTE_ADDR="::1").status_code == 200


def test_no_address_may_read_by_default(client, db, settings):
    """Not even the same host's: behind a reverse proxy on it, every request comes from 127.0.0.1."""
    settings.TEMPER_METRICS_ALLOW = ()
    settings.TEMPER_METRICS_TOKEN = ""
    assert client.get(URL, REMOTE_ADDR="127.0.0.1").status_code == 403
    assert client.get(URL, REMOTE_ADDR="::1").status_code == 403


def test_it_rejects_any_bearer_when_no_token_is_configured(client, db, settings):
    settings.TEMPER_METRICS_TOKEN = ""
    response = client.get(URL, headers={"Authorization": "Bearer "}, REMOTE_ADDR="10.1.2.3")
    assert response.status_code == 403


def test_the_allow_list_refuses_what_is_not_an_address_naming_it(monkeypatch):
    monkeypatch.setenv("TEMPER_METRICS_ALLOW", "10.0.0.0/8, proxy.local")
    with pytest.raises(ValueError, match="environment variable TEMPER_METRICS_ALLOW: 'proxy.local' is not an IP "
                                         "address or network"):
        env_networks("TEMPER_METRICS_ALLOW")


def test_it_counts_dataset_versions_by_status(client, team, settings):
    from webapp.datasets.models import Dataset, DatasetVersion

    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    dataset = Dataset.objects.create(project=team.project, name="chat", kind="sft", created_by=team.owner)
    for number, status in [(1, "ready"), (2, "failed"), (3, "ready")]:
        DatasetVersion.objects.create(
            dataset=dataset, number=number, file_path=f"x/{number}.jsonl", original_filename="a.jsonl",
            format="jsonl", size_bytes=1, status=status,
        )
    body = client.get(URL).content.decode()
    assert sample(body, 'temper_jobs{kind="dataset",state="ready"}') == 2
    assert sample(body, 'temper_jobs{kind="dataset",state="failed"}') == 1


def test_a_made_up_method_is_counted_as_other_not_as_a_label_of_its_own(client, db):
    """secqa: the request histogram was labelled by ``request.method`` as sent, and a server takes any token as a
    method: anyone could make each request a new label set (15 buckets kept for the process's life), growing the
    web process's memory and every scrape without bound. Methods outside HTTP's own are counted together."""
    for number in range(20):
        client.generic(f"SECQA{number}", "/healthz")
    client.generic("PATCH", "/healthz")
    methods = {sample.labels["method"] for metric in REQUEST_DURATION.collect() for sample in metric.samples}
    assert not [method for method in methods if method.startswith("SECQA")], sorted(methods)
    assert {"other", "PATCH"} <= methods
