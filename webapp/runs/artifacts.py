"""Downloads of what a run exported (its merged model, its LoRA adapter, exported checkpoints) as tar
archives, for the run page and the REST API alike.

A download is streamed a chunk at a time, never whole in memory: a model is gigabytes, often in one
safetensors file. The tar is written by hand (a header, the file's chunks, padding), since ``tarfile``
copies a whole file into its output at once, and handed to Django as an asynchronous iterator, since
its ASGI handler (uvicorn serves Temper) reads a synchronous one whole into a list before it sends a
byte. The chat's quantized serving copy inside a model export is jaxengine's own format, as large
again, and stays on the server.
"""
from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.http import Http404, StreamingHttpResponse

from webapp.core.numbers import whole_number
from webapp.core.streaming import CHUNK_BYTES, asynchronous
from webapp.runs.models import Artifact, ArtifactKind, Run
from webapp.runs.serving_copies import QUANTIZED_SUBDIR


def artifact_to_download(*, run: Run, kind: str, step: str | None) -> Artifact:
    """The run's ``kind`` artifact (``model``, ``adapter``, or ``checkpoint`` with ``step``) that is still
    on disk under the data root; Http404 naming what is missing otherwise. ``step`` is as sent (text):
    without it, a run's one model or adapter export, whatever step it holds."""
    artifacts = Artifact.objects.filter(run=run, kind=kind)
    if step is not None or kind == ArtifactKind.CHECKPOINT:
        number = whole_number(step)
        artifact = artifacts.filter(step=number).first() if number is not None else None
    else:
        artifact = artifacts.order_by("-step").first()
    if artifact is None:
        raise Http404(f"run {run.public_id} has no {kind} artifact" + (f" at step {step}" if step is not None else ""))
    directory = Path(artifact.path).resolve()
    if not directory.is_dir() or not directory.is_relative_to(Path(settings.DATA_ROOT).resolve()):
        raise Http404(f"the {kind} artifact of {run.public_id} is no longer on disk")
    return artifact


def artifact_tar_response(*, run: Run, artifact: Artifact) -> StreamingHttpResponse:
    """``artifact``'s directory as an uncompressed tar attachment (safetensors do not compress)."""
    leave_out = (QUANTIZED_SUBDIR,) if artifact.kind in (ArtifactKind.MODEL, ArtifactKind.CHECKPOINT) else ()
    response = StreamingHttpResponse(asynchronous(tar_stream(Path(artifact.path).resolve(), leave_out=leave_out)),
                                     content_type="application/x-tar")
    step = f"-step-{artifact.step}" if artifact.kind == ArtifactKind.CHECKPOINT else ""
    response["Content-Disposition"] = f'attachment; filename="{run.public_id}-{artifact.kind}{step}.tar"'
    return response


def _left_out(name: str, leave_out: tuple[str, ...]) -> bool:
    # jaxengine.quantize writes a serving copy beside its place as ``.quantized.writing-…`` and moves the
    # copy it replaces aside as ``.quantized.replaced-…``: the same copy, gone by a rename mid-download,
    # and left behind for good by a worker killed while writing.
    return any(name == subdirectory or name.startswith(f".{subdirectory}.") for subdirectory in leave_out)


def tar_stream(directory: Path, *, leave_out: tuple[str, ...] = ()) -> Iterator[bytes]:
    """A gzip-less tar of ``directory`` without its subdirectories named in ``leave_out`` (nor those
    directories' copies being written or replaced), in pieces of at most ``CHUNK_BYTES``."""
    for path in sorted(directory.rglob("*")):
        relative = path.relative_to(directory)
        if _left_out(relative.parts[0], leave_out) or path.is_symlink() or not path.is_file():
            continue
        with path.open("rb") as file:
            status = os.fstat(file.fileno())
            header = tarfile.TarInfo(str(Path(directory.name) / relative))
            header.size, header.mtime, header.mode = status.st_size, int(status.st_mtime), stat.S_IMODE(status.st_mode)
            yield header.tobuf(format=tarfile.PAX_FORMAT)
            left = header.size
            while left:
                chunk = file.read(min(CHUNK_BYTES, left))
                if not chunk:  # the header promised more: a tar cut here would be read as whole
                    raise OSError(f"{path} became shorter while it was being sent")
                left -= len(chunk)
                yield chunk
        yield tarfile.NUL * (-header.size % tarfile.BLOCKSIZE)
    yield tarfile.NUL * (2 * tarfile.BLOCKSIZE)  # the end of the archive
