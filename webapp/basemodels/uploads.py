"""Base models uploaded as an archive: a team without a shell on the server puts a model in its own folder.

An owner sends a ``.zip``, ``.tar`` or ``.tar.gz`` of a Hugging Face-format model directory. The request's body
streams to a temporary file (``datasets.uploads.LimitedUploadHandler``, bounded by
``TEMPER_MODEL_UPLOAD_MAX_BYTES``; the ASGI guard refuses a larger body before it is read), and
``basemodel_upload`` unpacks it into a hidden folder beside its destination (``projects/<slug>/.upload-*``, on the
same filesystem, so the last step is a rename), checks it with ``read_model_facts`` (the register form's checks and
messages), renames it to ``projects/<slug>/<name>/`` (``rename_without_replacing``: a folder made under that name
meanwhile, even an empty one, is left alone and the name refused) and registers it. Whatever fails, the hidden
folder goes, and so does the renamed one when the registration is refused: nothing half-unpacked, no row. The row
says it was uploaded (``BaseModel.uploaded``): an owner may delete the folder with it (``removal``), freeing the name.

The archive is untrusted: a member whose path leaves the folder (``..``, an absolute path), a link, a device or a
pipe is refused, and so is an archive that would unpack to more than the limit, judged on the sizes it declares
(before anything is written) and on the bytes written (a zip member's declared size can lie), or to more files and
folders than ``TEMPER_MODEL_UPLOAD_MAX_MEMBERS`` (millions of empty members use up a disk's inodes, not its bytes:
a zip's are counted before anything is written, a tar's as it streams, stopping at the first past the limit).

Unpacking runs in the request, not in a Celery task: it writes the bytes the request has just carried, from a
local temporary file, faster than they came over the network, so it adds a fraction to a request that is long
anyway; and the temporary file is the web process's (``FILE_UPLOAD_TEMP_DIR``), which a worker on another host
(docker-compose.multihost.yml) could not read without one more full copy to a shared place.

The Upload page (``basemodels.views.basemodel_upload``) and the REST API's ``POST base-models/``
(``api.views.base_models``) both send through ```basemodel_upload_once``: the same checks, messages and limits, and a
repeated sending (even one sent while the first still unpacks) answered with the first's model.
"""
from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import shutil
import stat
import gzip
import tarfile
import tempfile
import time
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import BinaryIO, TypeVar

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.template.defaultfilters import filesizeformat

from webapp.basemodels.inspection import UPLOAD_PARTIAL_PREFIX, ModelDirError, project_folder, read_model_facts
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import basemodel_named
from webapp.basemodels.services import BASE_MODEL_NAME_MAX, basemodel_register, name_taken_message
from webapp.basemodels.zip_end import TAIL_BYTES, zip_end
from webapp.core.disk_free import disk_full_message, is_disk_full
from webapp.core.text import checked_name
from webapp.projects.models import Project

ARCHIVE_SUFFIXES = (".zip", ".tar", ".tar.gz", ".tgz")
# The name is the folder's too: one path component, no hidden or special name.
FOLDER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
CHUNK_BYTES = 1024 * 1024
GZIP_MAGIC = b"\x1f\x8b"
MACOS_METADATA = "__MACOSX"
# A hidden upload folder this old is an abandoned one (see _remove_abandoned).
ABANDONED_AFTER_SECONDS = 24 * 3600
# A zip's central directory entry for a model's file: a few hundred bytes (46, the name, an extra field or two).
ZIP_CENTRAL_DIRECTORY_BYTES_PER_MEMBER = 4096
# A pax header or GNU long name holds a member's name and attributes: a few KB at most.
MAX_TAR_EXTENDED_HEADER_BYTES = 1024 * 1024
Sending = TypeVar("Sending")  # what a sending's once-only wrapper answers: a page's address, the API's Sent


class ArchiveError(ValueError):
    """An archive that cannot be unpacked as a model; the message names the archive, the member and what to do."""


def basemodel_upload(*, project: Project, name: str, archive: Path, archive_name: str, user: AbstractBaseUser | None,
                     max_bytes: int | None = None) -> BaseModel:
    """Unpack ``archive`` (the uploaded file, sent as ``archive_name``) into ``<models root>/projects/<slug>/<name>/``
    and register it in ``project`` under ``name`` (``model_archive_unpack``, then ``model_archive_register``); the
    caller has checked that ``user`` owns the project. Call it outside any transaction: unpacking takes minutes."""
    model_dir = model_archive_unpack(project=project, name=name, archive=archive, archive_name=archive_name,
                                     max_bytes=max_bytes)
    return model_archive_register(project=project, name=name, model_dir=model_dir, user=user)


def basemodel_upload_once(*, project: Project, name: str, archive: Path, archive_name: str,
                          user: AbstractBaseUser | None,
                          send_once: Callable[[Callable[[], str], Callable[[], None]], Sending],
                          made: Callable[[BaseModel], str]) -> Sending:
    """``basemodel_upload`` for a sending acted on once, the Upload page's and the REST API's: ``send_once`` is
    ``form_send_once`` or ``request_send_once`` bound to its request, called with the ``create`` that registers the
    model and returns ``made(base_model)`` (the model's page, its id) and the ``prepare`` that unpacks it. The sending
    is claimed first, so that a repeat, even one sent while the first still unpacks, unpacks nothing and is answered
    with the first's model; unpacked outside any transaction, registered inside the sending's; a folder unpacked for
    a sending that is not registered after all is removed."""
    model_dir: Path | None = None
    sent = False

    def unpack() -> None:
        nonlocal model_dir
        model_dir = model_archive_unpack(project=project, name=name, archive=archive, archive_name=archive_name)

    def register() -> str:
        return made(model_archive_register(project=project, name=name, model_dir=model_dir, user=user))

    try:
        answer = send_once(register, unpack)
        sent = True
        return answer
    finally:
        if model_dir is not None and not sent:  # unpacked, then refused (its registration rolled back)
            discard_unpacked(model_dir)


def archive_too_large_message(limit: int) -> str:
    """The refusal of an archive past ``TEMPER_MODEL_UPLOAD_MAX_BYTES`` as it arrives, on the page and in the API."""
    return (f"the archive is over the {filesizeformat(limit)} model upload limit (TEMPER_MODEL_UPLOAD_MAX_BYTES); ask "
            "an administrator to raise it, or to copy the model under the models root")


def several_archives_message(count: int) -> str:
    """The refusal of ``count`` files sent as the archive (the multipart parser keeps the last of them)."""
    return f"{count} files were sent: send the model as one archive (.zip, .tar or .tar.gz of its directory)"


def model_archive_register(*, project: Project, name: str, model_dir: Path, user: AbstractBaseUser | None) -> BaseModel:
    """Register ``model_archive_unpack``'s ``model_dir`` in ``project`` as ``name``; refused, the folder goes too."""
    try:
        return basemodel_register(project=project, name=name, path=str(model_dir), user=user, uploaded=True)
    except BaseException:
        discard_unpacked(model_dir)
        raise


def discard_unpacked(model_dir: Path) -> None:
    """Remove a folder ``model_archive_unpack`` made that is not to be registered after all."""
    shutil.rmtree(model_dir, ignore_errors=True)


def model_archive_unpack(*, project: Project, name: str, archive: Path, archive_name: str,
                         max_bytes: int | None = None) -> Path:
    """Unpack ``archive`` into ``<models root>/projects/<slug>/<name>/`` and return that folder, checked as the
    register form checks a directory but not registered (``model_archive_register``). Outside any transaction: a
    transaction open while it unpacks would hold SQLite's write lock (every other write waiting) for minutes.

    Raises ``ValidationError`` on ``name`` (not a folder name, taken by a base model or a folder) or on ``archive``
    (not an archive, an unsafe member, over ``max_bytes`` unpacked, not a model the register form takes, a models
    root Temper may not write to), and leaves nothing behind."""
    max_bytes = settings.TEMPER_MODEL_UPLOAD_MAX_BYTES if max_bytes is None else max_bytes
    name = checked_name(name, field="name", max_length=BASE_MODEL_NAME_MAX)
    if not FOLDER_NAME.fullmatch(name):
        raise ValidationError({"name": f"{name!r} is also the model's folder name: use letters, digits, '.', '_' and "
                                       "'-' only, starting with a letter or digit, e.g. 'llama-3.2-1b'"})
    if (taken := basemodel_named(project=project, name=name)) is not None:
        raise ValidationError({"name": name_taken_message(project, taken.name)})
    root = Path(settings.MODELS_ROOT).resolve()
    folder = project_folder(models_root=root, project_slug=project.slug)
    target = folder / name
    if _taken(target):
        raise ValidationError({"name": _folder_taken(target)})
    partial = _partial_folder(folder)
    try:
        try:
            unpack_archive(archive, archive_name=archive_name, into=partial, max_bytes=max_bytes)
            model_dir = _model_dir_in(partial)
            read_model_facts(model_dir, models_root=root, project_slug=project.slug)
        except (ArchiveError, ModelDirError) as error:
            # The hidden folder is gone once this is read: the message names the archive instead.
            raise ValidationError({"archive": str(error).replace(str(partial), archive_name)}) from None
        try:
            rename_without_replacing(model_dir, target)
        except FileExistsError:  # made while this one unpacked
            raise ValidationError({"name": _folder_taken(target)}) from None
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target


def _libc_renameat2():
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc 2.28+ (musl, macOS)
        return None
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    renameat2.restype = ctypes.c_int
    return renameat2


_RENAMEAT2 = _libc_renameat2()
_AT_FDCWD = -100
_RENAME_NOREPLACE = 1


def rename_without_replacing(source: Path, target: Path) -> None:
    """Rename the folder ``source`` to ``target``; ``FileExistsError`` when anything is at ``target``, an empty folder
    or a dangling link included (``os.rename`` replaces an empty folder on Linux). Linux's ``renameat2`` with
    ``RENAME_NOREPLACE`` decides in one step; where the C library or the filesystem lacks it, ``mkdir`` claims the
    name first (it fails on anything there) and the rename then replaces only that folder, still empty."""
    if _RENAMEAT2 is not None:
        if _RENAMEAT2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target), _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):  # those: the filesystem or kernel lacks it
            raise OSError(code, os.strerror(code), str(source), None, str(target))
    target.mkdir()
    try:
        os.rename(source, target)
    except BaseException as error:
        with contextlib.suppress(OSError):  # not empty: someone wrote into the claimed folder, and it is theirs now
            target.rmdir()
        if isinstance(error, OSError) and error.errno == errno.ENOTEMPTY:
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target)) from None
        raise


def _taken(path: Path) -> bool:
    return path.exists() or path.is_symlink()


def _folder_taken(target: Path) -> str:
    return (f"{target} already exists: choose another name (or register that directory on the Register page, if it "
            "is the model)")


def _partial_folder(folder: Path) -> Path:
    """A new hidden folder in ``folder`` (made, with its parents, if missing); a ``ValidationError`` naming it when
    Temper may not write there. Those of uploads whose process was killed while it unpacked go first."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _remove_abandoned(folder)
        return Path(tempfile.mkdtemp(prefix=UPLOAD_PARTIAL_PREFIX, dir=folder))
    except OSError as error:
        if is_disk_full(error):
            raise ValidationError({"archive": disk_full_message(folder)}) from None
        raise ValidationError({"archive": (
            f"cannot write to {folder} ({error.strerror or error}): the models root is read-only for Temper. Ask an "
            "administrator to make that folder writable by the user the web server runs as, or to copy the model "
            "there and register it on the Register page")}) from None


def _remove_abandoned(folder: Path) -> None:
    """Remove the hidden folders in ``folder`` untouched for ``ABANDONED_AFTER_SECONDS``: an upload unpacks in
    minutes, and the one whose process was killed (a restart, the memory killer) left its folder behind."""
    now = time.time()
    for partial in folder.glob(f"{UPLOAD_PARTIAL_PREFIX}*"):
        try:
            abandoned = now - partial.lstat().st_mtime > ABANDONED_AFTER_SECONDS and partial.is_dir()
        except FileNotFoundError:  # removed meanwhile by another upload's cleanup, or finished
            continue
        if abandoned and not partial.is_symlink():
            shutil.rmtree(partial, ignore_errors=True)


def _model_dir_in(unpacked: Path) -> Path:
    """The model directory in an unpacked archive: its top, or the one folder it holds (a directory packed with
    its own name, ``tar -czf m.tar.gz my-model/``; macOS's Compress adds a ``__MACOSX`` folder beside it)."""
    if (unpacked / "config.json").exists():
        return unpacked
    entries = [entry for entry in unpacked.iterdir() if entry.name != MACOS_METADATA]
    if len(entries) == 1 and entries[0].is_dir() and not entries[0].is_symlink():
        return entries[0]
    return unpacked


def unpack_archive(archive: Path, *, archive_name: str, into: Path, max_bytes: int) -> None:
    """Unpack the ``.zip``, ``.tar`` or ``.tar.gz`` at ``archive`` (sent as ``archive_name``) into the empty folder
    ``into``; an ``ArchiveError`` for an archive that is none of these, corrupt, holds an unsafe member or unpacks
    to more than ``max_bytes``. What was written before an error stays in ``into``, for the caller to remove."""
    lower = archive_name.lower()
    if not lower.endswith(ARCHIVE_SUFFIXES):
        raise ArchiveError(f"{archive_name}: not a .zip, .tar or .tar.gz file; pack the model directory as one")
    unpack = _unpack_zip if lower.endswith(".zip") else _unpack_tar
    try:
        unpack(archive, archive_name, into, max_bytes, settings.TEMPER_MODEL_UPLOAD_MAX_MEMBERS)
    except UnicodeDecodeError as error:  # zipfile decodes a name flagged UTF-8 strictly
        raise ArchiveError(f"{archive_name}: a member's name is marked as UTF-8 but is not (byte "
                           f"0x{error.object[error.start]:02x}); rename it and pack the model directory "
                           "again") from None
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, zlib.error, RuntimeError, NotImplementedError) as error:
        raise ArchiveError(f"{archive_name}: not a readable {_kind(lower)} archive ({error}); pack it again") from None
    except OSError as error:  # reading the archive: a bad gzip stream (writing is _unwritable's)
        raise ArchiveError(f"{archive_name}: not a readable {_kind(lower)} archive ({error}); pack it again") from None


def _kind(lower_name: str) -> str:
    return "zip" if lower_name.endswith(".zip") else "tar.gz" if lower_name.endswith((".gz", ".tgz")) else "tar"


def _unpack_zip(archive: Path, archive_name: str, into: Path, max_bytes: int, max_members: int) -> None:
    # zipfile reads the central directory whole into memory (an object per entry) before its members can be counted:
    # its size, from the end record (read where zipfile reads it: zip_end), is judged first.
    with open(archive, "rb") as raw:
        file_size = raw.seek(0, os.SEEK_END)
        raw.seek(max(file_size - TAIL_BYTES, 0))
        try:
            end = zip_end(raw.read(), file_size=file_size)
        except ValueError as error:
            raise ArchiveError(f"{archive_name}: not a readable zip archive ({error}); pack it again") from None
    central_bytes = end.central_directory_bytes if end is not None else 0  # None: zipfile refuses it next
    most = max_members * ZIP_CENTRAL_DIRECTORY_BYTES_PER_MEMBER
    if central_bytes > most:
        raise ArchiveError(f"{archive_name}: its central directory (the list of members) is {central_bytes:,} "
                           f"bytes, more than {max_members:,} members take ({most:,} bytes, 4 KiB a member, "
                           "TEMPER_MODEL_UPLOAD_MAX_MEMBERS); pack the model directory alone")
    with zipfile.ZipFile(archive) as packed:
        members = packed.infolist()
        if len(members) > max_members:
            raise _too_many(archive_name, max_members)
        declared = 0
        for member in members:  # everything judged before anything is written
            _destination(into, member.filename, archive_name)
            mode = member.external_attr >> 16  # no file type at all from zip tools that keep none (Windows')
            if stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR):
                raise _special(archive_name, member.filename, _mode_kind(mode))
            declared += member.file_size
            if declared > max_bytes:
                raise _too_large(archive_name, max_bytes, declared=True)
        written = 0
        for member in members:
            destination = _destination(into, member.filename, archive_name)
            if destination is None:
                continue
            if member.is_dir():
                _make_folder(destination, member.filename, archive_name)
                continue
            with packed.open(member) as source:
                written = _write(source, destination, member.filename, archive_name, written, max_bytes)


_TAR_EXTENDED_HEADER_TYPES = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                              tarfile.GNUTYPE_LONGLINK)


class _ExtendedHeaderTooLarge(tarfile.TarError):
    pass


class _BoundedTarInfo(tarfile.TarInfo):
    """A tar member whose extended header (pax attributes, a GNU long name) is refused past
    ``MAX_TAR_EXTENDED_HEADER_BYTES`` before it is read: tarfile reads one whole into memory, of the size the tar
    header declares, before the member it describes is seen or counted toward the limit."""

    def _proc_member(self, tarfile_):
        if self.type in _TAR_EXTENDED_HEADER_TYPES and self.size > MAX_TAR_EXTENDED_HEADER_BYTES:
            raise _ExtendedHeaderTooLarge(
                f"the member {self.name!r} is an extended header (a long name or pax attributes) of {self.size:,} "
                f"bytes, past the {MAX_TAR_EXTENDED_HEADER_BYTES:,} a tar packs for a name")
        return super()._proc_member(tarfile_)


def _unpack_tar(archive: Path, archive_name: str, into: Path, max_bytes: int, max_members: int) -> None:
    # Streamed ("r|"): a .tar.gz is decompressed once, member after member, as a zip's central directory cannot be.
    # A gzip stream is read through GzipFile, drained to its end once the tar is: tarfile's own stream reader never
    # checks gzip's CRC, and damage late in the stream can inflate into wrong bytes without a deflate error.
    with open(archive, "rb") as raw:
        gzipped = raw.read(2) == GZIP_MAGIC
        raw.seek(0)
        if not gzipped:
            # A plain tar (or bz2/xz, as tar -a packs them).
            with tarfile.open(fileobj=raw, mode="r|*", tarinfo=_BoundedTarInfo) as packed:
                _unpack_tar_members(packed, archive_name, into, max_bytes, max_members)
            return
        with gzip.GzipFile(fileobj=raw, mode="rb") as inflated:
            with tarfile.open(fileobj=inflated, mode="r|", tarinfo=_BoundedTarInfo) as packed:
                _unpack_tar_members(packed, archive_name, into, max_bytes, max_members)
            # The rest (tar's zero blocks): the CRC and length are checked at the end. Counted: zeros packed after the
            # tar inflate 1000:1, and an archive at the limit would otherwise keep the request inflating for hours.
            drained = 0
            while chunk := inflated.read(CHUNK_BYTES):
                drained += len(chunk)
                if drained > max_bytes:
                    raise ArchiveError(f"{archive_name}: its gzip stream goes on past the tar's end for more than "
                                       f"{filesizeformat(max_bytes)} ({max_bytes} bytes, "
                                       "TEMPER_MODEL_UPLOAD_MAX_BYTES); pack the model directory again (tar -czf)")


def _unpack_tar_members(packed: tarfile.TarFile, archive_name: str, into: Path, max_bytes: int,
                        max_members: int) -> None:
    declared = written = 0
    for count, member in enumerate(packed, start=1):
        if count > max_members:
            raise _too_many(archive_name, max_members)
        destination = _destination(into, member.name, archive_name)
        if not (member.isreg() or member.isdir()):
            raise _special(archive_name, member.name, _tar_kind(member))
        declared += member.size
        if declared > max_bytes:
            raise _too_large(archive_name, max_bytes, declared=True)
        if destination is None:
            continue
        if member.isdir():
            _make_folder(destination, member.name, archive_name)
            continue
        source = packed.extractfile(member)
        written = _write(source, destination, member.name, archive_name, written, max_bytes)


def _destination(into: Path, member_name: str, archive_name: str) -> Path | None:
    """Where ``member_name`` unpacks to in ``into``; None for the archive's top itself (``./``)."""
    # tarfile reads a name that is not UTF-8 with surrogate escapes, which no page or database can hold.
    if (escaped := next((char for char in member_name if "\udc80" <= char <= "\udcff"), None)) is not None:
        raise ArchiveError(f"{archive_name}: the member {member_name!r} has a name that is not UTF-8 text (byte "
                           f"0x{ord(escaped) - 0xDC00:02x}); rename it and pack the model directory again")
    path = PurePosixPath(member_name.replace("\\", "/"))
    if path.is_absolute() or ".." in path.parts or re.match(r"[A-Za-z]:", member_name):
        raise ArchiveError(f"{archive_name}: the member {member_name!r} would be written outside the model's folder "
                           "(an absolute path or '..'); pack the model directory with paths relative to it")
    parts = [part for part in path.parts if part != "."]
    return into.joinpath(*parts) if parts else None


def _special(archive_name: str, member_name: str, kind: str) -> ArchiveError:
    return ArchiveError(f"{archive_name}: the member {member_name!r} is a {kind}; a model archive holds plain files "
                        "and folders only: pack the files the links point to instead (tar -h, zip without -y)")


def _mode_kind(mode: int) -> str:
    return ("symbolic link" if stat.S_ISLNK(mode) else "device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "pipe" if stat.S_ISFIFO(mode) else "socket" if stat.S_ISSOCK(mode) else "special file")


def _tar_kind(member: tarfile.TarInfo) -> str:
    return ("symbolic link" if member.issym() else "hard link" if member.islnk()
            else "device" if member.ischr() or member.isblk() else "pipe" if member.isfifo() else "special file")


def _too_large(archive_name: str, max_bytes: int, *, declared: bool) -> ArchiveError:
    how = "its members' sizes add up to" if declared else "it unpacks to"
    return ArchiveError(f"{archive_name}: {how} more than {filesizeformat(max_bytes)} ({max_bytes} bytes, "
                        "TEMPER_MODEL_UPLOAD_MAX_BYTES); upload a smaller model, or ask an administrator to copy it "
                        "under the models root")


def _too_many(archive_name: str, max_members: int) -> ArchiveError:
    return ArchiveError(f"{archive_name}: it holds more than {max_members:,} files and folders "
                        "(TEMPER_MODEL_UPLOAD_MAX_MEMBERS); a model directory holds a few dozen: pack the model "
                        "directory alone, or ask an administrator to copy it under the models root")


def _write(source: BinaryIO, destination: Path, member_name: str, archive_name: str, written: int,
           max_bytes: int) -> int:
    """Copy ``source`` to the new file ``destination``, counting toward ``max_bytes`` with the ``written`` before;
    returns the bytes written in all."""
    _make_folder(destination.parent, member_name, archive_name)
    try:
        out = destination.open("xb")
    except FileExistsError:
        raise ArchiveError(f"{archive_name}: the member {member_name!r} is in the archive twice; pack it again") from None
    except OSError as error:
        raise _unwritable(archive_name, member_name, error) from None
    with out:
        while chunk := source.read(CHUNK_BYTES):
            written += len(chunk)
            if written > max_bytes:
                raise _too_large(archive_name, max_bytes, declared=False)
            try:
                out.write(chunk)
            except OSError as error:
                raise _unwritable(archive_name, member_name, error) from None
    return written


def _make_folder(folder: Path, member_name: str, archive_name: str) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise ArchiveError(f"{archive_name}: the member {member_name!r} needs a folder where the archive has a file of "
                           "that name; pack it again") from None
    except OSError as error:  # a name too long, a full disk
        raise _unwritable(archive_name, member_name, error) from None


def _unwritable(archive_name: str, member_name: str, error: OSError) -> ArchiveError:
    if is_disk_full(error):  # the hidden folder it was unpacking into is removed (model_archive_unpack)
        return ArchiveError(f"{archive_name}: the member {member_name!r} could not be written: "
                            f"{disk_full_message(settings.MODELS_ROOT)}")
    return ArchiveError(f"{archive_name}: the member {member_name!r} could not be written ({error.strerror or error}); "
                        "if the archive is sound (names of at most 255 bytes), ask an administrator whether the "
                        "models root's disk has room")
