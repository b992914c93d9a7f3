"""Deleting an uploaded model's folder with its registration: the one place Temper removes files under the models root.

Only a folder Temper unpacked itself (``BaseModel.uploaded``) goes, and only while it is still where the upload put
it: a plain folder directly in the project's own folder (``<models root>/projects/<slug>/<name>/``). The root is the
administrator's (resolved, as registration resolves it); below it, each folder on the way is opened relative to the
one before with ``O_NOFOLLOW | O_DIRECTORY``, so that a link put in place of ``projects``, ``<slug>`` or the model's
folder, before the check or between the check and the removal, is refused rather than followed. The removal is
``shutil.rmtree`` relative to the opened project folder (``dir_fd``): on Linux its descriptor-based walk
(``rmtree.avoids_symlink_attacks``) unlinks a link found inside the folder and never follows it, so what a link
planted there points to survives. Anything odd refuses the whole unregistering, files kept, saying why.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from django.conf import settings
from django.db.models import Q

from webapp.basemodels.inspection import project_folder
from webapp.basemodels.models import BaseModel
from webapp.core.bidi import isolated

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def uploaded_folder_refusal(*, base_model: BaseModel) -> str:
    """Why ``base_model``'s folder may not be deleted with its registration, or "" when it may (or is gone already).
    Called with the row locked, before anything is deleted."""
    path = Path(base_model.path)
    if not base_model.uploaded:
        return (f"{path} was registered where it lay, not uploaded: Temper deletes only the folders it unpacked "
                "itself; unregister the model without its files")
    if not shutil.rmtree.avoids_symlink_attacks:
        return (f"this system's shutil.rmtree could follow a link planted in {path} out of it, so Temper keeps the "
                "files; unregister the model without them and remove the folder by hand")
    root = Path(settings.MODELS_ROOT).resolve()
    own = project_folder(models_root=root, project_slug=base_model.project.slug)
    if (not path.is_absolute() or os.path.normpath(path) != str(path) or path.parent != own
            or path.name.startswith(".")):
        return (f"{path} is not a folder directly in this project's own folder {own} (the models root or the model "
                "moved since it was uploaded), so Temper keeps its files; unregister the model without them and ask "
                "an administrator to remove the folder")
    if (shared := _registered_inside(base_model)) is not None:
        return (f"{path} also holds the registered base model {shared}; unregister that one first, or this one "
                "without its files")
    try:
        with _opened_folder(root, own.relative_to(root).parts) as parent:
            folder_stat = os.stat(path.name, dir_fd=parent, follow_symlinks=False)
            parent_stat = os.fstat(parent)
    except FileNotFoundError:
        return ""  # removed by hand already: the registration may go, there is nothing to delete
    except OSError as error:
        return (f"{path}: {error.filename or own}: {error.strerror or error}, so Temper keeps its files; unregister "
                "the model without them and ask an administrator to look at it")
    if not stat.S_ISDIR(folder_stat.st_mode):
        kind = "a link" if stat.S_ISLNK(folder_stat.st_mode) else "not a folder"
        return (f"{path} is {kind} now, not the folder the upload made, so Temper keeps it; unregister the model "
                "without its files and ask an administrator to look at it")
    if folder_stat.st_dev != parent_stat.st_dev:
        return (f"{path} is a mount point now, not the folder the upload made, so Temper keeps its files; unregister "
                "the model without them and ask an administrator to look at it")
    return ""


def remove_uploaded_folder(*, path: str, project_slug: str) -> None:
    """Remove the folder ``path`` that ``uploaded_folder_refusal`` allowed, reached again without following a link
    (a link swapped in since raises ``OSError`` and nothing is removed). Gone already: nothing to do."""
    folder = Path(path)
    root = Path(settings.MODELS_ROOT).resolve()
    own = project_folder(models_root=root, project_slug=project_slug)
    if folder.parent != own or folder.name.startswith(".") or not folder.name:
        raise OSError(f"{folder} is no longer directly in {own}")
    try:
        with _opened_folder(root, own.relative_to(root).parts) as parent:
            if stat.S_ISLNK(os.stat(folder.name, dir_fd=parent, follow_symlinks=False).st_mode):
                raise OSError(errno.ELOOP, "a link now, not the folder the upload made", str(folder))
            shutil.rmtree(folder.name, dir_fd=parent)  # refuses a link swapped in since this check, too
    except FileNotFoundError:
        if os.path.lexists(folder):
            raise


@contextlib.contextmanager
def _opened_folder(root: Path, parts: tuple[str, ...]) -> Iterator[int]:
    """A descriptor of ``root / parts``, each of ``parts`` opened without following a link (``ELOOP`` if one is)."""
    descriptor = os.open(root, _DIRECTORY_FLAGS)
    try:
        for depth, part in enumerate(parts, start=1):
            try:
                inner = os.open(part, _DIRECTORY_FLAGS | os.O_NOFOLLOW, dir_fd=descriptor)
            except OSError as error:
                if error.errno not in (errno.ELOOP, errno.ENOTDIR):
                    raise
                raise OSError(error.errno, "a link or not a folder now", str(root.joinpath(*parts[:depth]))) from None
            os.close(descriptor)
            descriptor = inner
        yield descriptor
    finally:
        os.close(descriptor)


def _registered_inside(base_model: BaseModel) -> str | None:
    """Another base model registered at ``base_model``'s folder or inside it (in any project), named, or None."""
    other = (BaseModel.objects.exclude(pk=base_model.pk)
             .filter(Q(path=base_model.path) | Q(path__startswith=base_model.path.rstrip("/") + "/"))
             .order_by("pk").first())
    if other is None:
        return None
    if other.project_id == base_model.project_id:
        return f"{isolated(other.name)} ({other.public_id})"
    return "of another project"
