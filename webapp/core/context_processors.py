"""Template context every page gets."""
from __future__ import annotations

from django.http import HttpRequest

from webapp.core.disk_free import low_filesystems


def low_disk(request: HttpRequest) -> dict:
    """``low_disks``, for base.html's banner: the data filesystems short of free space, for a signed-in user. A
    callable, so that the template asks (a kept ``statvfs``) only where it renders the banner, not for every partial
    rendered with a request."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"low_disks": low_filesystems}
