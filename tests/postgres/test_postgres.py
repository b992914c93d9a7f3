"""Temper on PostgreSQL (``DATABASE_URL=postgres://...``): a throwaway cluster is
initialised in a temporary directory, every migration is applied to it and the
project services run against it, including the row locks and constraints that
SQLite does not enforce the same way.

Needs the PostgreSQL server binaries (``.ci/run`` installs Debian's postgresql);
as root, the cluster runs as the ``postgres`` system user, since PostgreSQL
refuses to run as root.
"""
from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.integration


def postgres_bin_dir() -> Path | None:
    on_path = shutil.which("pg_ctl")
    if on_path:
        return Path(on_path).resolve().parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(candidates[-1]).parent if candidates else None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


MIGRATE = "import django; django.setup(); from django.core.management import call_command; " \
          "call_command('migrate', '--noinput', verbosity=0)"


def run_django(code: str, database_url: str, data_root: Path) -> str:
    env = {**os.environ, "DATABASE_URL": database_url, "TEMPER_DATA": str(data_root)}
    env["DJANGO_SETTINGS_MODULE"] = "webapp.settings"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# The head of a script in which threads race on PostgreSQL: Django set up and migrated, what every race
# script uses imported, and the database checked to be PostgreSQL (SQLite runs writes one at a time).
RACE_PREAMBLE = """
import threading
import time

import django
django.setup()
from django.core.management import call_command
call_command("migrate", "--noinput", verbosity=0)
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection
from webapp.celery import app as celery_app
from webapp.projects import services as project_services

assert connection.vendor == "postgresql", connection.vendor


def outcome_of(action, refusal=ValidationError, made=lambda result: ""):
    '''("made", ``made`` of what ``action()`` returned), ("refused", the refusal's words) or ("failed", the
    error), on this thread's own connection, closed after.'''
    try:
        return ("made", made(action()))
    except refusal as error:
        return ("refused", " ".join(error.messages) if isinstance(error, ValidationError) else str(error))
    except Exception as error:
        return ("failed", repr(error))
    finally:
        connection.close()


def run_together(*targets):
    '''Each of ``targets`` on a thread of its own, started together; returns once all have ended.'''
    threads = [threading.Thread(target=target) for target in targets]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def race_in_order(first, *, readers, lock, delete, act, hold_after_lock=lambda **kwargs: True):
    '''A deletion and an action on two threads, the one named ``first`` ("delete" or ``act``'s name) ahead:
    the deletion holds half a second once its ``readers`` check (a (module, name) pair, patched for the race)
    has answered, the action once it took its ``lock`` (likewise; the first call for which
    ``hold_after_lock(**kwargs)``), while the other comes in. ``delete`` and ``act``'s function return their
    ``outcome_of``. Returns {"delete": outcome, act's name: outcome}.'''
    act_name, act_function = act
    reached = threading.Event()
    (readers_module, readers_name), (lock_module, lock_name) = readers, lock
    real_readers, real_lock = getattr(readers_module, readers_name), getattr(lock_module, lock_name)

    def readers_then_hold(**kwargs):
        problems = real_readers(**kwargs)
        if first == "delete":
            reached.set()
            time.sleep(0.5)  # the action is now under way
        return problems

    def lock_then_hold(**kwargs):
        locked = real_lock(**kwargs)
        if first == act_name and not reached.is_set() and hold_after_lock(**kwargs):
            reached.set()
            time.sleep(0.5)  # the deletion is now waiting for the action's locks
        return locked

    outcome = {}

    def side(name, function):
        def go():
            if first != name:
                reached.wait(10)
            outcome[name] = function()
        return go

    setattr(readers_module, readers_name, readers_then_hold)
    setattr(lock_module, lock_name, lock_then_hold)
    try:
        run_together(side(act_name, act_function), side("delete", delete))
    finally:
        setattr(readers_module, readers_name, real_readers)
        setattr(lock_module, lock_name, real_lock)
    return outcome
"""


SERVICES_SCRIPT = """
import django
django.setup()
from django.db import IntegrityError, connection, transaction
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from webapp.projects import services, selectors
from webapp.projects.models import Membership, Role

assert connection.vendor == "postgresql", connection.vendor
users = get_user_model().objects
owner = users.create_user("owner", password="x")
mate = users.create_user("mate", password="x")
project = services.project_create(name="PG", slug="pg", owner=owner)
services.membership_add(project=project, user=mate, role=Role.VIEWER)
listed = [(p.slug, p.role, p.member_count) for p in selectors.project_list_for_user(user=mate)]
assert listed == [("pg", "viewer", 2)], listed
try:
    services.membership_remove(membership=Membership.objects.get(user=owner))
except ValidationError as error:
    assert "last owner" in str(error)
else:
    raise AssertionError("the last owner was removed")
try:
    with transaction.atomic():
        Membership.objects.create(project=project, user=mate, role=Role.MEMBER)
except IntegrityError:
    pass
else:
    raise AssertionError("a second membership for the same user was accepted")
try:
    with transaction.atomic():
        Membership.objects.filter(user=mate).update(role="admin")
except IntegrityError:
    pass
else:
    raise AssertionError("an unknown role was stored")
# PostgreSQL refuses NUL in text and JSON (a DataError, a 500): the services refuse it first, by field.
from webapp.datasets import services as dataset_services
from webapp.runs import services as run_services
external = run_services.run_create_external(project=project, name="laptop", config={}, user=owner)
for field, make in (
    ("name", lambda: dataset_services.dataset_create(project=project, name="a\\x00", kind="sft", user=owner)),
    ("config.lr", lambda: run_services.run_create_external(project=project, name="x", config={"lr": "1\\x00"}, user=owner)),
    ("points.0.metrics", lambda: run_services.metrics_log(run=external, points=[{"step": 1, "metrics": {"a\\x00": 1.0}}])),
    ("notes", lambda: run_services.run_update_details(run=external, notes="n\\x00")),
):
    try:
        with transaction.atomic():
            make()
    except ValidationError as error:
        assert list(error.message_dict) == [field], error.message_dict
    else:
        raise AssertionError(f"a NUL in {field} reached PostgreSQL")
# Names are one name in any letter case and script, whatever the database's collation makes of LOWER: the
# stored name_key is unique per project.
from webapp.datasets.models import Dataset
dataset_services.dataset_create(project=project, name="Straße", kind="sft", user=owner)
for other in ("STRASSE", "straße"):
    try:
        with transaction.atomic():
            Dataset.objects.create(project=project, name=other, kind="sft")
    except IntegrityError:
        pass
    else:
        raise AssertionError(f"{other!r} was stored beside 'Straße'")
# A model's NUL (a byte-fallback <0x00> token) cannot be refused: its chat answer and its logged sample are
# stored with U+FFFD in its place, where the UPDATE or INSERT failed.
from webapp.chat.models import Conversation, Message, MessageStatus
from webapp.chat.services import message_finish
from webapp.runs.reporting import sample_row
conversation = Conversation.objects.create(project=project, user=owner, model_ref="bm_x", model_label="x")
answer = Message.objects.create(conversation=conversation, role="assistant", status=MessageStatus.STREAMING)
message_finish(message_id=answer.public_id, text="a\\x00b", finish_reason="stop")
answer.refresh_from_db()
assert answer.content == "a\\ufffdb", repr(answer.content)
sample_row(external, 1, 0, {"prompt": "p", "text": "x\\x00", "answer": "\\x00"}).save()
assert external.samples.get().text == "x\\ufffd"
print("ok")
"""


def test_migrations_and_services_on_postgres(postgres_cluster, tmp_path):
    """Every migration applied to an empty database (the other tests' databases are copies of one migrated so)."""
    database_url = postgres_cluster.url(postgres_cluster.create())
    run_django(MIGRATE + "; call_command('makemigrations', '--check', '--dry-run', verbosity=0)", database_url, tmp_path)
    assert run_django(SERVICES_SCRIPT, database_url, tmp_path).strip() == "ok"


POOL_SCRIPT = """
import asyncio
import django
django.setup()
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.handlers.asgi import ASGIHandler
from django.db import connection, connections
from django.test import Client
from webapp.chat.models import Conversation, Message
from webapp.projects.services import project_create

assert settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"] == settings.TEMPER_DB_POOL_MAX
owner = get_user_model().objects.create_user("pool-owner", password="x")
project = project_create(name="Pool", slug="pool", owner=owner)
conversation = Conversation.objects.create(project=project, user=owner, model_ref="bm_x", model_label="x")
answer = Message.objects.create(conversation=conversation, role="assistant", content="hello", status="complete")
client = Client()
client.force_login(owner)
cookie = f"sessionid={client.cookies['sessionid'].value}".encode()
connection.close()  # back to the pool: the requests below are all that uses it


def sessions() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()")
        count = cursor.fetchone()[0]
    connection.close()
    return count


async def get(app, path, on_start=None):
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"cookie", cookie)], "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 8)}
    request, status, body = [{"type": "http.request", "body": b"", "more_body": False}], [], bytearray()

    async def receive():
        if request:
            return request.pop()
        await asyncio.Event().wait()

    async def send(message):
        if message["type"] == "http.response.start":
            status.append(message["status"])
            if on_start:
                on_start()
        else:
            body.extend(message.get("body", b""))

    await app(scope, receive, send)
    return status[0], bytes(body)


app = ASGIHandler()
before = sessions()
for _ in range(20):  # each request's database work runs in a new thread (a connection each, without a pool)
    assert asyncio.run(get(app, "/p/pool/chat/"))[0] == 200
opened = sessions() - before - 1  # less the count's own
assert opened <= 2, f"20 requests opened {opened} PostgreSQL sessions"

pool = connections["default"].pool
checked_out = []
status, body = asyncio.run(get(app, f"/p/pool/chat/{conversation.public_id}/messages/{answer.public_id}/events/",
                               on_start=lambda: checked_out.append(pool.get_stats()["pool_size"] - pool.get_stats()["pool_available"])))
assert status == 200 and b'"text": "hello"' in body, body
assert checked_out == [0], f"{checked_out} connections were held by a stream as it started"
print("ok")
"""


def test_connections_are_pooled_across_requests_and_a_stream_holds_none(database_url, tmp_path):
    """Under uvicorn each request's ORM work runs in a thread of its own: without a pool every request
    connected to PostgreSQL anew; and a stream (a token stream, run events, a download) held its request's
    connection until its last byte."""
    # The chat page names its static files from the manifest collectstatic writes.
    migrate = ("import django; django.setup(); from django.core.management import call_command; "
               "call_command('migrate', '--noinput', verbosity=0); call_command('collectstatic', '--noinput', verbosity=0)")
    run_django(migrate, database_url, tmp_path)
    assert run_django(POOL_SCRIPT, database_url, tmp_path).strip().splitlines()[-1] == "ok"


FORK_SCRIPT = """
import os, sys, time
import django
django.setup()
import psycopg
from django.db import connection

if sys.argv[1] == "registered":
    import worker.celery  # what a Celery worker's main process runs: it registers the at-fork handler
with connection.cursor() as cursor:
    cursor.execute("SELECT 1")
connection.close()  # back to the pool, idle, as the heartbeat's is between beats


def sessions():  # of this database, from a connection of its own (not the pool's)
    with psycopg.connect(os.environ["DATABASE_URL"]) as probe:
        return {row[0] for row in probe.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()")}


time.sleep(0.5)  # the pool's own filling done
before = sessions()
assert before, "the pool holds no connection"
child = os.fork()
if child == 0:  # what Celery's Django fixup does in each new prefork child
    connection.close()
    connection.close_pool()
    os._exit(0)
os.waitpid(child, 0)
time.sleep(1.0)  # a session told to end is gone well within this
print("kept" if before <= sessions() else "ended")
"""


def test_a_forked_worker_child_leaves_its_parents_pooled_connections_open(database_url, tmp_path):
    """A prefork child closed the pool it inherited, ending the PostgreSQL sessions of its parent's idle
    pooled connections (the parent's heartbeat then failed with "server closed the connection
    unexpectedly", or found the connection dead and opened another). Asked of the server: the sessions
    the parent's pool held before the fork are all there after the child's exit."""
    def run(mode: str) -> str:
        env = {**os.environ, "DATABASE_URL": database_url, "TEMPER_DATA": str(tmp_path),
               "DJANGO_SETTINGS_MODULE": "webapp.settings"}
        result = subprocess.run([sys.executable, "-c", FORK_SCRIPT, mode], cwd=ROOT, env=env, capture_output=True,
                                text=True, timeout=180)
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout.strip().splitlines()[-1]

    assert run("registered") == "kept"
    assert run("unregistered") == "ended"  # what the handler prevents
