"""Benchmark: how long the duplicate-submission check takes to tell a large model archive (``form_send_once``'s
fields digest, ``webapp.core.submissions._form_fields``), whole-file hash against ``sample_files`` (name, size,
first and last MiB).

Writes a sparse file of ``--gigabytes`` in the system temporary folder (deleted at the end), hands it to the digest
as Django's upload handler hands a spooled upload (an ``UploadedFile`` on the open file), and prints the best of
``--repeats`` for each. A sparse file reads as zeros from memory, without the disk: the whole-file time is the
hashing alone, the least a real archive costs.

    PYTHONPATH=$PWD .venv/bin/python bench/upload_fingerprint.py [--gigabytes 1] [--repeats 3]
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import django

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
django.setup()

from django.core.files.uploadedfile import UploadedFile  # noqa: E402
from django.http import HttpRequest, QueryDict  # noqa: E402
from django.utils.datastructures import MultiValueDict  # noqa: E402

from webapp.core.submissions import _form_fields  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gigabytes", type=float, default=1.0)
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    size = int(options.gigabytes * 1024**3)
    with tempfile.NamedTemporaryFile(suffix=".zip") as sparse:
        sparse.truncate(size)
        request = HttpRequest()
        request.POST = QueryDict("name=model&submission_token=t")
        request.FILES = MultiValueDict({"archive": [UploadedFile(file=sparse, name="model.zip", size=size)]})
        for sample_files in (False, True):
            times = []
            for _ in range(options.repeats):
                start = time.perf_counter()
                _form_fields(request, sample_files=sample_files)
                times.append(time.perf_counter() - start)
            print(f"{size / 1024**3:g} GiB, sample_files={sample_files}: best {min(times) * 1000:.1f} ms "
                  f"of {options.repeats}")


if __name__ == "__main__":
    main()
