"""The admin site's users: an administrator's password reset also revokes the account's API tokens, as the
person's own change does by default (``throttle.ThrottledPasswordChangeForm``). An administrator sets a password
for a person locked out or whose password leaked; tokens made with the old one kept working."""
from __future__ import annotations

from django.contrib import admin, messages
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

    def user_change_password(self, request, id, form_url=""):
        response = super().user_change_password(request, id, form_url)
        if request.method == "POST" and response.status_code == 302:  # changed: Django redirects to the user
            messages.info(request, "Their other sessions were signed out and their API tokens revoked (REST and "
                                   "every project's /v1/ tokens).")
        return response
