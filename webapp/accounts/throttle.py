"""Login throttling. Django's login views check as many passwords as they are sent, so a guesser could
try a password list against a known account (``admin``) at the speed of the server. After
``MAX_FAILURES`` wrong passwords for one account from one client address within ``WINDOW_SECONDS``, that
account's logins from that address are refused, right password or not, until ``WINDOW_SECONDS`` after the
last failure. Keyed by account *and* address so that a stranger cannot lock a person out from elsewhere.

The address is the client's (``webapp.core.addresses.client_address``): behind a reverse proxy listed in
``TEMPER_TRUSTED_PROXIES``, the one it forwards. Behind one that is not listed, or does not pass the client's
address on, every client has the proxy's address: ten wrong guesses by anyone locked the account's owner out
too. So a browser that signed in to the account before
carries a signed cookie saying so (``DEVICE_COOKIE``, set by ``views.LoginView``), and its attempts are counted
under that browser instead of the address (``MAX_FAILURES`` too): what strangers send does not lock it. Browsers
without one are counted under the address and, every address together, under the account
(``settings.TEMPER_LOGIN_ACCOUNT_MAX_FAILURES``, 100 by default): guessers spread over many addresses are held to
that, and what they can lock is only the account's sign-in from browsers it never used.

Each attempt is counted before its password is checked (``_count_attempt``: one ``UPDATE … count + 1``, or
the row's INSERT, in a transaction), and a right password then forgives the count: had the count been read first
and written after a failure, a burst of parallel guesses would all have read a count under the limit and been
checked. So however many guesses arrive at once, at most ``MAX_FAILURES`` passwords are checked.

The counts are rows of the database (``AttemptCount``), which every web process shares, so the limit holds
however many processes answer sign-ins (uvicorn ``--workers``, several containers); a web process's own
memory (Django's local-memory cache, where they were) gave a guesser the limit once per process. Not Redis:
signing in needs the database anyway (the user, the session), so counting there adds no way for a sign-in to
fail, where a Redis outage would have either refused every sign-in (failing closed) or lifted the limit
(failing open). A count past its window is deleted by the next attempt, whatever its key (an index on
``expires_at``), so the table holds only the counts still running. Both login forms (``/accounts/login/`` and
the admin site's) use it.

Changing a password checks the current one, so a stolen session (a browser left signed in) could guess it
there instead, then change it and keep the account. ``ThrottledPasswordChangeForm`` counts wrong current
passwords the same way, keyed by the account alone: whoever asks is already signed in as it, so no stranger
can lock it, and a guesser holding the session gains nothing from changing address. The admin site's
password change page leads to the same form (``webapp/urls.py``)."""
from __future__ import annotations

import hashlib
import secrets
from datetime import timedelta

from django import forms
from django.conf import settings
from django.core import signing
from django.contrib.admin.forms import AdminAuthenticationForm
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.db import IntegrityError, transaction
from django.db.models import F
from django.utils import timezone

from webapp.accounts.models import AttemptCount
from webapp.accounts.services import account_token_count, api_tokens_kept
from webapp.core.addresses import client_address

MAX_FAILURES = 10
WINDOW_SECONDS = 15 * 60


def _key(username: str, address: str) -> str:
    # Hashed: a username is text a person typed, of any length and characters, and a key has 100 characters.
    digest = hashlib.sha256(f"{username.casefold()}\0{address}".encode()).hexdigest()
    return f"login:{digest}"


def _account_key(username: str) -> str:
    digest = hashlib.sha256(username.casefold().encode()).hexdigest()
    return f"login-account:{digest}"


DEVICE_COOKIE = "temper_device"
DEVICE_COOKIE_MAX_AGE = 365 * 24 * 60 * 60
_DEVICE_SALT = "webapp.accounts.throttle.device"


def device_cookie_value(username: str, current: str | None) -> str:
    """The signed ``DEVICE_COOKIE`` of a browser that has just signed in as ``username``: its device id kept when
    ``current`` (the cookie it sent) was already for that account, else a new one."""
    device = _device_in(current, username) or secrets.token_hex(16)
    return signing.dumps({"user": username.casefold(), "device": device}, salt=_DEVICE_SALT)


def _device_in(cookie: str | None, username: str) -> str | None:
    """The device id of ``cookie`` when it is a valid, unexpired one of the account ``username``, else None."""
    if not cookie:
        return None
    try:
        value = signing.loads(cookie, salt=_DEVICE_SALT, max_age=DEVICE_COOKIE_MAX_AGE)
    except signing.BadSignature:
        return None
    if not isinstance(value, dict) or value.get("user") != username.casefold():
        return None
    return value.get("device") if isinstance(value.get("device"), str) else None


def _password_change_key(user_pk: int) -> str:
    return f"password-change:{user_pk}"


def _count_attempt(key: str) -> int:
    """Counts an attempt at ``key`` before its password is checked; returns the attempts counted since the
    last right password, this one included."""
    # Counts past their window, any key's: nothing else deletes them. A statement of its own, outside the
    # transaction below, so that an attempt's transaction locks no row but its own.
    AttemptCount.objects.filter(expires_at__lte=timezone.now()).delete()
    while True:
        now = timezone.now()
        with transaction.atomic():
            # The UPDATE adds to the count where it stands (its row locked until the commit; on SQLite the
            # transaction holds the write lock), so parallel attempts each get a count of their own.
            if AttemptCount.objects.filter(key=key, expires_at__gt=now).update(count=F("count") + 1):
                return AttemptCount.objects.values_list("count", flat=True).get(key=key)
            # A count past its window: this attempt starts anew. Only if past: on PostgreSQL each statement
            # sees what committed before it, so a row a parallel attempt made since the UPDATE is counted on.
            AttemptCount.objects.filter(key=key, expires_at__lte=now).delete()
            try:
                with transaction.atomic():
                    AttemptCount.objects.create(key=key, count=1, expires_at=now + timedelta(seconds=WINDOW_SECONDS))
                return 1
            except IntegrityError:  # a parallel attempt made the row first (PostgreSQL): add to it
                continue


def _count_failure(key: str) -> None:
    # The count was taken before the check; a failure only moves the window to run from now.
    AttemptCount.objects.filter(key=key).update(expires_at=timezone.now() + timedelta(seconds=WINDOW_SECONDS))


def _checked_within_limit(key: str, check, *, refusal: str, shared: tuple[str, int, str] | None = None):
    """``check()`` (a form's password check), counted under ``key`` before it runs: refused with ``refusal`` past
    ``MAX_FAILURES`` attempts in the window, a failure keeping its count, a success clearing it. ``shared``: a
    ``(key, limit, refusal)`` counted too, refused past ``limit``, that a success does not clear (the account's
    count from every address) but takes its own attempt off."""
    if _count_attempt(key) > MAX_FAILURES:
        raise forms.ValidationError(refusal, code="throttled")
    if shared is not None and _count_attempt(shared[0]) > shared[1]:
        raise forms.ValidationError(shared[2], code="throttled")
    try:
        result = check()
    except forms.ValidationError:
        _count_failure(key)
        if shared is not None:
            _count_failure(shared[0])
        raise
    AttemptCount.objects.filter(key=key).delete()
    if shared is not None:
        AttemptCount.objects.filter(key=shared[0], count__gt=0).update(count=F("count") - 1)
    return result


class ThrottledLogin:
    """A mixin for Django's authentication forms: refuses an account's login from an address that sent
    too many wrong passwords for it, and counts each wrong password."""

    def clean(self):
        username = self.cleaned_data.get("username") or ""
        if not username or not self.cleaned_data.get("password"):
            # No password is checked (the empty field has its own error), so nothing is counted, and
            # nothing forgiven: an empty password must not clear a guesser's count.
            return super().clean()
        wait = f"wait {WINDOW_SECONDS // 60} minutes and try again"
        device = _device_in(self.request.COOKIES.get(DEVICE_COOKIE), username) if self.request is not None else None
        if device is not None:  # a browser that signed in as this account before: only its own guesses count
            return _checked_within_limit(
                _key(username, f"device:{device}"), super().clean,
                refusal=f"Too many failed logins for this account from this browser: {wait}, or ask an "
                        "administrator to set a new password.")
        address = client_address(self.request) if self.request is not None else ""
        return _checked_within_limit(
            _key(username, address), super().clean,
            refusal=f"Too many failed logins for this account from your address: {wait}, or ask an administrator "
                    "to set a new password.",
            shared=(_account_key(username), settings.TEMPER_LOGIN_ACCOUNT_MAX_FAILURES,
                    f"Too many failed logins for this account from browsers it has not signed in with: {wait}, sign "
                    "in from a browser you signed in with before, or ask an administrator to set a new password."))


class ThrottledAuthenticationForm(ThrottledLogin, AuthenticationForm):
    pass


class ThrottledAdminAuthenticationForm(ThrottledLogin, AdminAuthenticationForm):
    pass


class ThrottledPasswordChangeForm(PasswordChangeForm):
    """Django's password change form, refusing an account's change after too many wrong current passwords.
    The account's other sessions end with the change (Django's session hash: the page that changed it stays
    signed in) and its API tokens are revoked, as every new password revokes them (``signals``), unless the box is
    unticked (``api_tokens_kept``); ``revoked_tokens`` says how many, after ``save``."""

    revoke_tokens = forms.BooleanField(
        required=False, initial=True, label="Also revoke my API tokens",
        help_text="REST API tokens and the projects' /v1/ tokens: programs using them are refused until given new "
                  "ones. Leave it ticked if the old password may have leaked.")
    revoked_tokens = 0

    def save(self, commit: bool = True):
        if self.cleaned_data.get("revoke_tokens"):
            self.revoked_tokens = account_token_count(user=self.user) if commit else 0
            return super().save(commit=commit)
        with api_tokens_kept(user=self.user):
            return super().save(commit=commit)

    def clean_old_password(self):
        return _checked_within_limit(
            _password_change_key(self.user.pk), super().clean_old_password,
            refusal=f"Too many wrong current passwords for this account: wait {WINDOW_SECONDS // 60} minutes and "
                    "try again, or ask an administrator to set a new password.")
