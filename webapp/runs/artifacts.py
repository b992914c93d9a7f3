"""Downloads of what a run exported (its merged model, its LoRA adapter, exported checkpoints) as tar
archives, for the run page and the REST API alike.

A download is streamed a chunk at a time, never whole in memory: a model is gigabytes, often in one
safetensors file. The tar is written by hand (a header, the file's chunks, padding), since ``tarfile``
copies a whole file into its output at once, and handed to Django as an asynchronous iterator, since
its ASGI handler (uvicorn serves Temper) reads a synchronous one whole into a list before it sends a
byte.

What each download holds (``downloaded_files``): a run's merged model is the Hugging Face model only.
The engine writes a LoRA run's adapter inside it (``export/adapter/``), which is a download of its own,
and the chat's quantized serving copy (jaxengine's own format, as large again) inside any model export;
both stay out of it, as do the serving copy's directories being written or moved aside. An exported
checkpoint keeps its adapter, which has no other download. The size recorded beside a download
(``download_size``) counts the same files.
"""
from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.http import Http404, StreamingHttpResponse

from jaxengine import licence
from jaxengine.model_card import CARD_FILE
from jaxengine.words import counted, named
from webapp.core.bidi import isolated
from webapp.core.numbers import whole_number
from webapp.core.sse import AccessLost
from webapp.core.streaming import CHUNK_BYTES, asynchronous
from webapp.runs.models import Artifact, ArtifactKind, Run, RunStatus
from webapp.runs.serving_copies import QUANTIZED_SUBDIR


def _why_none(run: Run, kind: str) -> str:
    """Why ``run`` has no ``kind`` artifact, and what to do: the bare "has no adapter artifact" left a script to
    guess whether it would come."""
    if kind == ArtifactKind.CHECKPOINT:
        return "; export a checkpoint on the run's page (Checkpoints), then download it here with ?step=N"
    if run.status != RunStatus.SUCCEEDED:
        return f" (it {run.status_phrase}): a run exports its model, and a LoRA run its adapter, when it succeeds"
    if kind == ArtifactKind.ADAPTER:
        return "; only a run with peft.method lora or qlora writes one: download model/ for the trained weights"
    return ""


def artifact_to_download(*, run: Run, kind: str, step: str | None) -> Artifact:
    """The run's ``kind`` artifact (``model``, ``adapter``, or ``checkpoint`` with ``step``) that is still
    on disk under the data root; Http404 naming what is missing otherwise. ``step`` is as sent (text):
    without it, a run's one model or adapter export, whatever step it holds."""
    if kind not in ArtifactKind.values:
        raise Http404(f"'{isolated(kind)}' is not a kind of artifact; download model, adapter, or checkpoint?step=N")
    artifacts = Artifact.objects.filter(run=run, kind=kind)
    if step is not None or kind == ArtifactKind.CHECKPOINT:
        number = whole_number(step)
        artifact = artifacts.filter(step=number).first() if number is not None else None
    else:
        artifact = artifacts.order_by("-step").first()
    if artifact is None:
        # Said as "has no checkpoint artifact" for a checkpoint asked without its step, the run had some.
        steps = list(artifacts.order_by("step").values_list("step", flat=True))
        if not steps:
            raise Http404(f"run {run.public_id} has no {kind} artifact{_why_none(run, kind)}")
        there = f"{counted(len(steps), f'{kind} artifact')}, at {named('step', steps)}"
        if step is None:
            raise Http404(f"give the exported checkpoint's step as ?step=N; run {run.public_id} has {there}")
        raise Http404(f"run {run.public_id} has no {kind} artifact at step {isolated(step)}; it has {there}")
    if artifact.folder_gone or not Path(artifact.path).resolve().is_relative_to(Path(settings.DATA_ROOT).resolve()):
        raise Http404(f"the {kind} artifact of {run.public_id} is no longer on disk")
    return artifact


ADAPTER_SUBDIR = "adapter"  # jaxengine.job.export_trained's LoRA adapter inside a model export

# The subdirectories of an artifact's directory that its download leaves out, by kind.
LEFT_OUT = {
    ArtifactKind.MODEL: (QUANTIZED_SUBDIR, ADAPTER_SUBDIR),
    ArtifactKind.CHECKPOINT: (QUANTIZED_SUBDIR,),
    ArtifactKind.ADAPTER: (),
}


def artifact_tar_response(*, run: Run, artifact: Artifact, access_lost: AccessLost, label: str
                          ) -> StreamingHttpResponse:
    """``artifact``'s directory as an uncompressed tar attachment (safetensors do not compress), streamed while
    ``access_lost()`` says nothing (``webapp.core.streaming``; ``label`` names the download there)."""
    stream = tar_stream(Path(artifact.path).resolve(), kind=artifact.kind)
    response = StreamingHttpResponse(asynchronous(stream, access_lost=access_lost, label=label),
                                     content_type="application/x-tar")
    step = f"-step-{artifact.step}" if artifact.kind == ArtifactKind.CHECKPOINT else ""
    response["Content-Disposition"] = f'attachment; filename="{run.public_id}-{artifact.kind}{step}.tar"'
    return response


def _left_out(name: str, leave_out: tuple[str, ...]) -> bool:
    # jaxengine.quantize writes a serving copy beside its place as ``.quantized.writing-…`` and moves the
    # copy it replaces aside as ``.quantized.replaced-…``: the same copy, gone by a rename mid-download,
    # and left behind for good by a worker killed while writing.
    return any(name == subdirectory or name.startswith(f".{subdirectory}.") for subdirectory in leave_out)


# Past this size a README.md is not one the engine wrote (a few KiB): the page refuses it rather than render it.
MODEL_CARD_MAX_BYTES = 1 << 20


def model_card_text(artifact: Artifact) -> str:
    """The model card (``README.md``, ``jaxengine.model_card``) the engine wrote into ``artifact``'s folder; Http404
    saying why when there is none: an export written before exports had cards (export it again), or a card too large
    to be the engine's."""
    path = Path(artifact.path) / CARD_FILE
    try:
        size = path.stat().st_size
    except OSError:
        raise Http404(f"the {artifact.kind} artifact of {artifact.run.public_id} has no model card: it was exported "
                      "before exports had one; export it again to write its card") from None
    if size > MODEL_CARD_MAX_BYTES:
        raise Http404(f"the model card of the {artifact.kind} artifact of {artifact.run.public_id} is {size:,} bytes, "
                      "larger than the engine writes; read it in the downloaded folder")
    return path.read_text(encoding="utf-8", errors="replace")


def split_front_matter(card: str) -> tuple[str, str]:
    """(YAML front matter, Markdown body) of a model card; ``("", card)`` for a card without front matter."""
    front_matter, body = licence.split_front_matter(card)
    return front_matter or "", body


def downloaded_files(directory: Path, *, kind: str) -> list[Path]:
    """The plain files (not links) under ``directory`` that the download of a ``kind`` artifact holds, in
    order: all but those in the subdirectories ``LEFT_OUT`` names for the kind."""
    leave_out = LEFT_OUT[kind]
    return [path for path in sorted(directory.rglob("*"))
            if not _left_out(path.relative_to(directory).parts[0], leave_out)
            and not path.is_symlink() and path.is_file()]


def download_size(directory: Path, *, kind: str) -> int:
    """The bytes of the files the download of a ``kind`` artifact in ``directory`` holds."""
    return sum(path.stat().st_size for path in downloaded_files(directory, kind=kind))


def tar_stream(directory: Path, *, kind: str) -> Iterator[bytes]:
    """A gzip-less tar of what the download of a ``kind`` artifact in ``directory`` holds, named under
    the directory's name, in pieces of at most ``CHUNK_BYTES``."""
    files = downloaded_files(directory, kind=kind)
    for path in files:
        relative = path.relative_to(directory)
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
