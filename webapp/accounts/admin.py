"""The admin site's users: an administrator's password reset also revokes the account's API tokens, as the
person's own change does by default (``throttle.ThrottledPasswordChangeForm``). An administrator sets a password
for a person locked out or whose password leaked; tokens made with the old one kept working."""
from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminPasswordChangeForm

from webapp.accounts.services import account_tokens_revoke


class ResettingAdminPasswordChangeForm(AdminPasswordChangeForm):
    def save(self, commit: bool = True):
        user = super().save(commit=commit)
        if commit:
            account_tokens_revoke(user=user)
        return user


admin.site.unregister(get_user_model())


@admin.register(get_user_model())
class TemperUserAdmin(UserAdmin):
    change_password_form = ResettingAdminPasswordChangeForm
