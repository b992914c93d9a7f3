"""The PostgreSQL tests' databases: one throwaway cluster per test process, and a database of each test file's own
on it, a copy of one that ``migrate`` made (tests/postgres/test_postgres.py migrates an empty one itself). Before,
each file initialised and started a cluster of its own and its first script migrated it: 1-2 s and about 5 s a file
(bench/RESULTS.md, "Test suite time, session 42")."""
from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.postgres.test_postgres import MIGRATE, free_port, postgres_bin_dir, run_django


class Cluster:
    """A throwaway PostgreSQL cluster (a temporary directory, fsync off) and the databases made on it."""

    def __init__(self, port: int, as_user: list[str], bin_dir: Path):
        self.port, self.as_user, self.bin_dir = port, as_user, bin_dir
        self.made = 0

    def url(self, name: str) -> str:
        return f"postgres://temper@127.0.0.1:{self.port}/{name}"

    def create(self, *, template: str | None = None) -> str:
        """A new database of its own (a copy of ``template``, or empty), its name."""
        self.made += 1
        name = f"temper_{self.made}"
        copy = ["-T", template] if template else []
        self.pg(str(self.bin_dir / "createdb"), "-h", "127.0.0.1", "-p", str(self.port), "-U", "temper", *copy, name)
        return name

    def pg(self, *command: str) -> None:
        result = subprocess.run([*self.as_user, *command], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, f"{' '.join(command)} failed:\n{result.stdout}\n{result.stderr}"


@pytest.fixture(scope="session")
def postgres_cluster():
    """One cluster per test process: initdb and a server start cost 1-2 s, so each test file gets a database of
    its own on it (``database_url``) instead of a cluster of its own."""
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL server binaries (pg_ctl, initdb) are not installed; .ci/run installs postgresql")
    as_user: list[str] = []
    if os.geteuid() == 0:
        try:
            account = pwd.getpwnam("postgres")
        except KeyError:
            pytest.skip("running as root and there is no 'postgres' system user to run the cluster as")
        as_user = ["runuser", "-u", "postgres", "--"]
    base = Path(tempfile.mkdtemp(prefix="temper-pg-"))
    if as_user:
        os.chown(base, account.pw_uid, account.pw_gid)
    cluster = Cluster(free_port(), as_user, bin_dir)
    data_dir = base / "cluster"
    cluster.pg(str(bin_dir / "initdb"), "-D", str(data_dir), "-U", "temper", "--auth=trust", "-E", "UTF8", "--no-sync")
    options = f"-p {cluster.port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off"
    cluster.pg(str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-o", options, "-l", str(base / "log"), "-w", "start")
    try:
        yield cluster
    finally:
        cluster.pg(str(bin_dir / "pg_ctl"), "-D", str(data_dir), "-m", "immediate", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture(scope="session")
def migrated_template(postgres_cluster, tmp_path_factory) -> str:
    """A database that ``migrate`` made, once per process, to copy: a full migrate of an empty database takes
    about 5 s, a copy 0.2 s. ``test_migrations_and_services_on_postgres`` migrates an empty one itself."""
    name = postgres_cluster.create()
    run_django(MIGRATE, postgres_cluster.url(name), tmp_path_factory.mktemp("pg-template"))
    return name


@pytest.fixture(scope="module")
def database_url(postgres_cluster, migrated_template):
    """A database of the test file's own, migrated (a copy of ``migrated_template``), on the process's cluster."""
    return postgres_cluster.url(postgres_cluster.create(template=migrated_template))
