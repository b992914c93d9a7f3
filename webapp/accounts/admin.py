"""The admin site's users: an administrator's password reset revokes the account's API tokens, as every new
password does (``signals``); so does making the password unusable (the form's "Password-based authentication"
off), which sets no password and so is not one the signal sees. An administrator sets a password for a person
locked out or whose password leaked; tokens made with the old one kept working."""
from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.forms import AdminPasswordChangeForm

from webapp.accounts.services import account_tokens_revoke


class ResettingAdminPasswordChangeForm(AdminPasswordChangeForm):
    def save(self, commit: bool = True):
        user = super().save(commit=commit)
        if commit and not self.cleaned_data["set_usable_password"]:
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
