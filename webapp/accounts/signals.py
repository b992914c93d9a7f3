"""A password saved by any path ends what the old one started (``services.account_password_changed``). Django has
no signal for a new password, and the paths that set one are many, some of them Django's own (``manage.py
changepassword``, the admin site's form, a ``set_password`` in the shell): each had to remember to revoke the
account's API tokens, and the commands did not.

Django marks a password given to ``set_password`` on the instance (``_password``, what its password validators'
``password_changed`` hook is called with) until the save that stores it; a login that stores the same password
again with a newer hasher (``check_password``'s upgrade) clears the mark first, so only a new password counts."""
from __future__ import annotations

from webapp.accounts.services import account_password_changed


def user_saved(sender, instance, created: bool, update_fields, **kwargs) -> None:
    """``post_save`` of the user model (connected in ``apps.AccountsConfig.ready``)."""
    if created or getattr(instance, "_password", None) is None:
        return
    if update_fields is not None and "password" not in update_fields:  # the new password was not the one saved
        return
    account_password_changed(user=instance)
