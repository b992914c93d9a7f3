"""The signing key: TEMPER_SECRET_KEY, or one made at random once per data root (webapp/secret.py). The
default was a development key written in this repository, so anyone could forge a fresh install's signed
page cursors and the cookie that carries its flash messages."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from webapp.secret import SecretKeyError, secret_key

ROOT = Path(__file__).resolve().parents[2]


def test_a_data_root_gets_a_random_key_of_its_own_readable_by_its_owner_only(tmp_path):
    first, other = secret_key("", tmp_path / "a"), secret_key("  ", tmp_path / "b")
    assert len(first) >= 60 and first != other
    assert secret_key("", tmp_path / "a") == first  # read again, not made again
    assert stat.S_IMODE((tmp_path / "a" / "secret_key").stat().st_mode) == 0o600
    assert sorted(path.name for path in (tmp_path / "a").iterdir()) == ["secret_key"]  # no draft left behind


def test_a_key_given_is_the_key_and_no_file_is_made(tmp_path):
    assert secret_key("given-key", tmp_path) == "given-key"
    assert list(tmp_path.iterdir()) == []


def test_processes_starting_together_sign_with_one_key(tmp_path):
    code = "import sys; from pathlib import Path; from webapp.secret import secret_key; print(secret_key('', Path(sys.argv[1])))"
    processes = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                                  text=True) for _ in range(8)]
    keys = {process.communicate(timeout=60)[0].strip() for process in processes}
    assert len(keys) == 1 and len(keys.pop()) >= 60


def test_a_key_file_that_cannot_be_made_or_holds_no_key_is_named_with_what_to_do(tmp_path):
    (tmp_path / "not-a-directory").write_text("")
    with pytest.raises(SecretKeyError, match=r"not-a-directory/secret_key .*set TEMPER_SECRET_KEY"):
        secret_key("", tmp_path / "not-a-directory")
    (tmp_path / "secret_key").write_text("\n")
    with pytest.raises(SecretKeyError, match=r"secret_key holds no key .*delete it"):
        secret_key("", tmp_path)


def test_a_fresh_install_without_the_variable_signs_with_its_data_roots_key(tmp_path):
    env = {key: value for key, value in os.environ.items() if key != "TEMPER_SECRET_KEY"}
    env.update(TEMPER_DATA=str(tmp_path), DJANGO_SETTINGS_MODULE="webapp.settings")
    code = "import django; django.setup(); from django.conf import settings; print(settings.SECRET_KEY)"
    keys = [subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=120, check=True).stdout.strip() for _ in range(2)]
    assert keys[0] == keys[1] == (tmp_path / "secret_key").read_text().strip()
    assert "insecure" not in keys[0]
