"""Downloads (a dataset version's file, a run's export as a tar; from the pages and through the REST API) stop
within ``sse.ACCESS_RECHECK_SECONDS`` of their client losing the right to them, as the live streams and the /v1
answers do: removed from the project, or the account deactivated. A model is gigabytes: its download went on to
its last byte. The stream ends short, so the client sees an unfinished file (fewer bytes than its Content-Length,
a tar without its end)."""
import logging
import re
import socket

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.contrib.auth import get_user_model
from django.test import AsyncClient

from tests.webapp.factories import make_base_model, make_ready_version
from webapp.api.services import token_create
from webapp.core import sse
from webapp.core.streaming import CHUNK_BYTES
from webapp.projects.models import Membership
from webapp.projects.services import membership_remove
from webapp.runs import services as run_services
from webapp.runs.models import Artifact, ArtifactKind

# Larger than what the server can have written ahead into its socket's send buffer (Linux grows it up to
# net.ipv4.tcp_wmem's 4 MiB) while the client reads its first chunk: the rest waits on the client, past the access check.
SIZE = 16 * CHUNK_BYTES + 1
# The client's receive buffer, fixed (Linux otherwise grows it up to net.ipv4.tcp_rmem's maximum, 32 MiB on some hosts).
CLIENT_RECEIVE_BUFFER = 256 * 1024


def remove_from_project(team) -> None:
    membership_remove(membership=Membership.objects.get(project=team.project, user=team.viewer))


def deactivate(team) -> None:
    get_user_model().objects.filter(pk=team.viewer.pk).update(is_active=False)


def dataset_file(team, monkeypatch) -> tuple[str, str]:
    version = make_ready_version(team.project)
    version.absolute_path.write_bytes(b"x" * SIZE)
    dataset = version.dataset.public_id
    return (f"/p/alpha/datasets/{dataset}/v/{version.number}/download/",
            f"/api/v1/projects/alpha/datasets/{dataset}/versions/{version.number}/file/")


def run_export(team, monkeypatch) -> tuple[str, str]:
    monkeypatch.setattr(run_services.celery_app, "send_task", lambda *args, **kwargs: None)
    spec = {"task": "sft", "model": make_base_model(team.project).public_id,
            "data": {"train": make_ready_version(team.project).public_id}, "train": {"max_steps": 5}}
    run = run_services.run_create(project=team.project, spec=spec, user=team.owner, name="exported")
    export = run.output_dir / "export"
    export.mkdir(parents=True)
    (export / "model.safetensors").write_bytes(b"x" * SIZE)
    Artifact.objects.create(run=run, kind=ArtifactKind.MODEL, step=5, path=str(export))
    return (f"/p/alpha/runs/{run.public_id}/artifacts/model/",
            f"/api/v1/projects/alpha/runs/{run.public_id}/artifacts/model/")


@pytest.mark.django_db(transaction=True)  # the ASGI handler reads from threads of its own
@pytest.mark.parametrize("lose_access", [remove_from_project, deactivate], ids=lambda lose: lose.__name__)
@pytest.mark.parametrize("download", [dataset_file, run_export], ids=lambda download: download.__name__)
@pytest.mark.parametrize("through", ["page", "api"])
def test_a_download_stops_when_its_client_loses_access(team, monkeypatch, lose_access, download, through):
    monkeypatch.setattr(sse, "ACCESS_RECHECK_SECONDS", 0.0)  # asked again before every chunk after the first
    page, api = download(team, monkeypatch)
    client = AsyncClient()
    if through == "page":
        client.force_login(team.viewer)
        url, headers = page, {}
    else:
        _token, secret = token_create(user=team.viewer, name="laptop")
        url, headers = api, {"Authorization": f"Bearer {secret}"}

    async def received() -> tuple[int, int]:
        response = await client.get(url, headers=headers)
        assert response.status_code == 200
        chunks = aiter(response.streaming_content)
        first = len(await anext(chunks))
        await sync_to_async(lose_access)(team)
        return first, first + sum([len(chunk) async for chunk in chunks])

    first, total = async_to_sync(received)()
    assert 0 < first and total < SIZE


@pytest.mark.django_db(transaction=True)  # the server's threads read the rows this test writes
@pytest.mark.parametrize("download", [dataset_file, run_export], ids=lambda download: download.__name__)
def test_a_download_cut_on_purpose_is_one_plain_line_in_the_servers_log(team, monkeypatch, served, caplog, download):
    """Cut short by Temper (its client lost access), a file's download made uvicorn log 'Exception in ASGI
    application' with h11's traceback ('Too little data for declared Content-Length'), and said nothing of whose
    download it was; a tar's (no Content-Length) ended with the chunked body's last chunk, as if whole. Now one line
    of Temper's names the download, its account and why, and the client sees the transfer fail in both."""
    import http.client

    monkeypatch.setattr(sse, "ACCESS_RECHECK_SECONDS", 0.0)
    _page, api = download(team, monkeypatch)
    _token, secret = token_create(user=team.viewer, name="laptop")
    connection = http.client.HTTPConnection("127.0.0.1", served, timeout=30)
    connection.connect()
    connection.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, CLIENT_RECEIVE_BUFFER)
    connection.request("GET", api, headers={"Authorization": f"Bearer {secret}"})
    whole = connection.getresponse().read()  # not cut: whole, as before
    assert len(whole) == SIZE if download is dataset_file else len(whole) > SIZE
    connection.request("GET", api, headers={"Authorization": f"Bearer {secret}"})
    response = connection.getresponse()
    assert response.status == 200
    first = len(response.read1(CHUNK_BYTES))
    remove_from_project(team)
    with pytest.raises(http.client.IncompleteRead) as unfinished:
        response.read()
    connection.close()
    assert 0 < first + len(unfinished.value.partial) < SIZE
    [cut] = [record for record in caplog.records if record.name == "webapp.core.streaming"]
    assert re.fullmatch(rf"GET {api} by alpha-viewer: download cut short after [0-9,]+ bytes, as its client may no "
                        r"longer read it: its access check refuses it now \(404: no such project\)", cut.getMessage())
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR], caplog.text
    assert "Traceback" not in caplog.text
