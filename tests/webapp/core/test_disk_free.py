"""Free disk space said before it bites (webapp.core.disk_free): the Storage page, its API answer and the Workers page
say the data directory's free and total space, and every signed-in page shows a banner once it runs low."""
from __future__ import annotations

import html
import re
import shutil
import time
from pathlib import Path

from django.test import Client

from webapp.api.services import token_create
from webapp.core import disk_free

GIB = 1024**3


def banner(page: str) -> str | None:
    start = page.find('<section class="disk-banner" id="disk-low"')
    if start < 0:
        return None
    return re.sub(r'<span class="size"[^>]*>([^<]*)</span>', r"\1", html.unescape(page[start:page.index("</section>", start)])).replace("\xa0", " ")


def test_a_low_disk_puts_a_banner_on_signed_in_pages_naming_the_free_space_and_linking_to_storage(team, client_for,
                                                                                                  fake_disk):
    fake_disk.free = 2 * GIB  # under 5 GiB, the default threshold (5 % of 100 GiB is 5 GiB too)
    client = client_for(team.viewer)
    shown = banner(client.get("/p/alpha/").content.decode())
    assert shown is not None
    assert "The server's disk is running low: 2.0 GB free of 100.0 GB on the filesystem of <code>TEMPER_DATA</code>" in shown, shown
    assert '<a href="/p/alpha/storage/">This project\'s Storage page</a>' in shown
    # Away from a project, it names no project's page.
    assert "Each project's Storage page shows" in banner(client.get("/workers/").content.decode())
    # Signed out: nothing said of the server's disk.
    assert banner(Client().get("/accounts/login/").content.decode()) is None


def test_no_banner_while_the_disk_has_room(team, client_for, fake_disk):
    fake_disk.free = 6 * GIB
    assert banner(client_for(team.viewer).get("/p/alpha/").content.decode()) is None


def test_a_small_disk_is_low_under_5_percent_not_5_gib(team, client_for, fake_disk, settings):
    """On a 20 GiB disk 5 GiB is a quarter of it: a banner that would never go away. 5 % of it (1 GiB) is the bar."""
    fake_disk.total, fake_disk.free = 20 * GIB, int(1.5 * GIB)
    client = client_for(team.viewer)
    assert banner(client.get("/p/alpha/").content.decode()) is None
    fake_disk.free = int(0.9 * GIB)
    assert banner(client.get("/p/alpha/").content.decode()) is not None
    settings.TEMPER_DISK_WARN_FREE_BYTES = 0  # turned off
    assert banner(client.get("/p/alpha/").content.decode()) is None


def test_a_threshold_an_administrator_sets_is_taken_as_it_is_above_5_percent_too(team, client_for, fake_disk, settings):
    """Unset, the bar is the smaller of 5 GiB and 5 % of the disk; set, it is the bytes set: 10 GiB on a 100 GiB disk
    with 8 GiB free shows the banner, where the automatic bar (5 GiB) does not."""
    fake_disk.total, fake_disk.free = 100 * GIB, 8 * GIB
    client = client_for(team.viewer)
    assert banner(client.get("/p/alpha/").content.decode()) is None
    settings.TEMPER_DISK_WARN_FREE_BYTES = 10 * GIB
    assert banner(client.get("/p/alpha/").content.decode()) is not None


def test_the_storage_page_api_and_workers_page_say_the_real_free_and_total_space(team, client_for, settings):
    disk_free.forget_kept()
    real = shutil.disk_usage(settings.DATA_ROOT)
    page = html.unescape(client_for(team.viewer).get("/p/alpha/storage/").content.decode())
    assert '<dd data-setting="TEMPER_DATA"><span class="size" data-bytes="' in page
    assert f'title="{real.total:,} bytes">' in page
    _row, secret = token_create(user=team.viewer, name="read")
    answer = Client().get("/api/v1/projects/alpha/storage/", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert answer["filesystem_bytes"] == real.total
    assert abs(answer["free_bytes"] - real.free) < 256 * 1024**2  # other writers on this disk meanwhile
    # The models root is on the same filesystem here: one entry.
    assert answer["filesystems"] == [{"setting": "TEMPER_DATA", "free_bytes": answer["free_bytes"],
                                      "filesystem_bytes": real.total, "low": False}]
    workers = html.unescape(client_for(team.viewer).get("/workers/").content.decode())
    assert '<code>TEMPER_DATA</code> <span class="size" data-bytes="' in workers
    assert f'title="{real.total:,} bytes">' in workers


def test_the_storage_page_says_a_low_disk(team, client_for, fake_disk):
    fake_disk.free = GIB
    page = client_for(team.viewer).get("/p/alpha/storage/").content.decode()
    assert "<strong>running low</strong>: runs may fail mid-checkpoint and uploads be refused" in page


def test_statvfs_is_asked_once_in_its_kept_seconds_per_path(monkeypatch, tmp_path):
    calls = []

    def counted(path):
        calls.append(path)
        return shutil._ntuple_diskusage(100, 40, 60)

    monkeypatch.setattr(disk_free, "disk_usage", counted)
    disk_free.forget_kept()
    try:
        assert disk_free.free_and_total(tmp_path) == (60, 100)
        assert disk_free.free_and_total(tmp_path) == (60, 100)
        assert len(calls) == 1
        # A folder not made yet is measured on the disk it will be made on.
        assert disk_free.free_and_total(tmp_path / "not" / "yet") == (60, 100)
        assert calls[-1] == tmp_path
        monkeypatch.setattr(disk_free, "KEPT_SECONDS", 0.01)
        time.sleep(0.02)
        disk_free.free_and_total(tmp_path)
        assert len(calls) == 3
    finally:
        disk_free.forget_kept()


def test_a_models_root_on_another_filesystem_is_measured_and_said_too(team, client_for, settings, fake_disk,
                                                                      monkeypatch, tmp_path):
    """No second filesystem can be mounted for a test: the models root is told apart by its device number."""
    settings.MODELS_ROOT = tmp_path / "shared-models"
    real_device = disk_free._device
    monkeypatch.setattr(disk_free, "_device", lambda path: -1 if Path(path) == settings.MODELS_ROOT
                        else real_device(path))
    fake_disk.free = GIB
    _row, secret = token_create(user=team.viewer, name="read")
    answer = Client().get("/api/v1/projects/alpha/storage/", HTTP_AUTHORIZATION=f"Bearer {secret}").json()
    assert [disk["setting"] for disk in answer["filesystems"]] == ["TEMPER_DATA", "TEMPER_MODELS_ROOT"]
    assert all(disk["low"] for disk in answer["filesystems"])
    shown = banner(client_for(team.viewer).get("/p/alpha/").content.decode())
    assert "on the filesystem of <code>TEMPER_MODELS_ROOT</code>" in shown
