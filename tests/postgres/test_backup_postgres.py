"""``manage.py temper_backup`` and ``temper_restore`` on PostgreSQL: an installation backed up with pg_dump (custom
format) is restored into another database and data directory, with its rows and the paths they hold; a target
holding data is refused, then replaced whole with --force, tables of its own included; a load that fails leaves the
target as it was, files included."""
from __future__ import annotations

import json
import tarfile
from pathlib import Path

import psycopg
import pytest

from tests.webapp.backup.installations import DUMP, SEED, installation, moved, ok, run_in

pytestmark = pytest.mark.integration


def other_database(database_url: str, name: str) -> str:
    """A new empty database ``name`` on the cluster of ``database_url``, and its address."""
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute(f"CREATE DATABASE {name}")
    return database_url.rsplit("/", 1)[0] + f"/{name}"


@pytest.fixture(scope="module")
def source(postgres_cluster, migrated_template, tmp_path_factory):
    """A seeded installation on PostgreSQL and its backup: (its environment, the backup, its rows). Its database is a
    copy of one migrated (tests/postgres/conftest.py), as the seed's ``migrate`` leaves an empty one."""
    base = tmp_path_factory.mktemp("pg-source")
    database = postgres_cluster.create(template=migrated_template)
    environment = installation(base, database_url=postgres_cluster.url(database))
    ok(run_in(environment, "-c", SEED))
    backup = base / "temper.tar"
    result = run_in(environment, "temper_backup", str(backup))
    assert result.returncode == 0, result.stderr
    return environment, backup, json.loads(ok(run_in(environment, "-c", DUMP)))


def test_a_backup_restores_into_another_database_and_data_directory(source, database_url, tmp_path):
    source, backup, rows = source
    with tarfile.open(backup) as archive:
        manifest = json.loads(archive.extractfile("manifest.json").read())
        assert archive.extractfile("database/temper.pgdump").read(5) == b"PGDMP"  # pg_dump's custom format
    assert manifest["database"]["engine"] == "postgresql" and "runs.0001_initial" in manifest["database"]["migrations"]

    target = installation(tmp_path / "target", database_url=other_database(database_url, "backup_target"))
    result = run_in(target, "temper_restore", str(backup))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "database: loading into PostgreSQL in one transaction" in result.stderr
    assert "1 user, 1 project, 1 dataset version, 1 base model, 1 run" in result.stdout
    expected = moved(rows, source["TEMPER_DATA"], target["TEMPER_DATA"])
    assert json.loads(ok(run_in(target, "-c", DUMP))) == expected

    result = run_in(target, "temper_restore", str(backup))
    assert result.returncode != 0 and "auth_user (1 row)" in result.stderr and "--force" in result.stderr
    with psycopg.connect(target["DATABASE_URL"], autocommit=True) as connection:
        connection.execute("CREATE TABLE later_migrations_table (id integer)")
        connection.execute("UPDATE auth_user SET username = 'renamed-since'")
    result = run_in(target, "temper_restore", "--force", str(backup))
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(ok(run_in(target, "-c", DUMP))) == expected
    with psycopg.connect(target["DATABASE_URL"]) as connection:
        assert connection.execute("SELECT to_regclass('later_migrations_table')").fetchone() == (None,)


def test_a_failed_load_leaves_the_database_and_the_data_directory_as_they_were(source, database_url,
                                                                                tmp_path):
    """The target's role may read its database but not create tables in it (PostgreSQL 15 grants CREATE on schema
    public to its owner only): the load fails, and the files already moved into place are moved back."""
    _source, backup, _rows = source
    address = other_database(database_url, "backup_read_only")
    with psycopg.connect(database_url, autocommit=True) as connection:
        connection.execute("CREATE ROLE reader LOGIN")
    target = installation(tmp_path, database_url=address.replace("//temper@", "//reader@"))
    data = Path(target["TEMPER_DATA"])
    data.mkdir(parents=True)
    (data / "notes.txt").write_text("a team's own file")
    result = run_in(target, "temper_restore", "--force", str(backup))
    assert result.returncode != 0 and "restored" not in result.stdout, result.stdout + result.stderr
    assert "loading the database (nothing of it was changed) failed" in result.stderr
    assert "permission denied for schema public" in result.stderr
    assert sorted(path.name for path in data.iterdir()) == ["notes.txt", "secret_key"]
    with psycopg.connect(address) as connection:
        assert connection.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)
