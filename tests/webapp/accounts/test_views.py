"""Login, logout and password change."""
import os
import subprocess
import sys
import threading
from datetime import timedelta

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.forms import AuthenticationForm, PasswordChangeForm
from django.db import connection
from django.test import Client, RequestFactory
from django.urls import reverse
from django.utils import timezone

from webapp.accounts.models import AttemptCount, Preferences
from webapp.accounts.selectors import preferences_for
from webapp.accounts.throttle import (MAX_FAILURES, ThrottledAuthenticationForm, ThrottledLogin,
                                     ThrottledPasswordChangeForm)

from tests.live import ROOT, database_url_for_workers
from tests.webapp.factories import PASSWORD


class TestLogin:
    url = "/accounts/login/"

    def test_it_works(self, team, client):
        assert client.get(self.url).status_code == 200
        response = client.post(self.url, {"username": "alpha-owner", "password": PASSWORD, "next": "/p/alpha/"})
        assert response.status_code == 302
        assert response["Location"] == "/p/alpha/"
        assert client.get("/p/alpha/").status_code == 200

    @pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil.example/",
                                        "\\\\evil.example", "javascript:alert(1)", "http:evil.example",
                                        " https://evil.example/", "https:/evil.example"])
    def test_it_rejects_a_next_address_of_another_site(self, team, client, target):
        # A link to Temper's login page that sends the person on to another site once signed in (a look-alike
        # asking for the password again) goes to the projects page instead.
        page = client.get(self.url, {"next": target})
        assert page.status_code == 200
        response = client.post(self.url, {"username": "alpha-owner", "password": PASSWORD, "next": target})
        assert (response.status_code, response["Location"]) == (302, settings.LOGIN_REDIRECT_URL)

    def test_it_rejects_wrong_password(self, team, client):
        response = client.post(self.url, {"username": "alpha-owner", "password": "wrong"})
        assert response.status_code == 200
        assert b"correct username and password" in response.content
        assert client.get("/").status_code == 302


class TestLogout:
    url = "/accounts/logout/"

    def test_it_works(self, team, client_for):
        client = client_for(team.owner)
        response = client.post(self.url)
        assert response.status_code == 302
        assert client.get("/").status_code == 302

    @pytest.mark.parametrize("target", ["https://evil.example/", "//evil.example/", "/\\evil.example/"])
    def test_it_rejects_a_next_address_of_another_site(self, team, client_for, target):
        response = client_for(team.owner).post(self.url, {"next": target})
        assert (response.status_code, response["Location"]) == (302, reverse("accounts:login"))

    def test_it_rejects_get(self, team, client_for):
        client = client_for(team.owner)
        assert client.get(self.url).status_code == 405
        assert client.get("/").status_code == 200


class TestPasswordChange:
    url = "/accounts/password/"

    def test_it_works(self, team, client_for):
        client = client_for(team.owner)
        assert client.get(self.url).status_code == 200
        response = client.post(
            self.url,
            {"old_password": PASSWORD, "new_password1": "a-new-long-phrase", "new_password2": "a-new-long-phrase"},
        )
        assert response.status_code == 302
        assert response["Location"] == "/accounts/password/done/"
        user = get_user_model().objects.get(username="alpha-owner")
        assert user.check_password("a-new-long-phrase")

    def test_it_requires_access(self, client, db):
        response = client.get(self.url)
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")

    def test_it_rejects_wrong_old_password(self, team, client_for):
        response = client_for(team.owner).post(
            self.url, {"old_password": "nope", "new_password1": "a-new-long-phrase", "new_password2": "a-new-long-phrase"}
        )
        assert response.status_code == 200
        assert b"old password was entered incorrectly" in response.content
        assert get_user_model().objects.get(username="alpha-owner").check_password(PASSWORD)


class TestReviewShortcuts:
    """A reviewer's own setting: the reviewing page's single-key shortcuts on or off (WCAG 2.1.4)."""

    url = "/accounts/review-shortcuts/"

    def test_it_works(self, team, client_for):
        client = client_for(team.teammate)
        response = client.post(self.url, {"review_shortcuts": "off", "next": "/p/alpha/review/"})
        assert (response.status_code, response["Location"]) == (302, "/p/alpha/review/")
        assert not preferences_for(user=team.teammate).review_shortcuts
        assert preferences_for(user=team.owner).review_shortcuts, "one person's setting only"
        client.post(self.url, {"review_shortcuts": "on", "next": "/p/alpha/review/"})
        assert preferences_for(user=team.teammate).review_shortcuts
        assert Preferences.objects.filter(user=team.teammate).count() == 1

    def test_it_requires_access(self, client, db):
        response = client.post(self.url, {"review_shortcuts": "off"})
        assert response.status_code == 302
        assert response["Location"].startswith("/accounts/login/")
        assert not Preferences.objects.exists()

    def test_it_rejects_get(self, team, client_for):
        assert client_for(team.teammate).get(self.url).status_code == 405

    def test_it_rejects_a_value_other_than_on_or_off(self, team, client_for):
        client = client_for(team.teammate)
        response = client.post(self.url, {"review_shortcuts": "sometimes", "next": "/p/alpha/"}, follow=True)
        assert response.redirect_chain == [("/p/alpha/", 302)]
        assert "review_shortcuts must be on or off, not &#x27;sometimes&#x27;" in response.content.decode()
        assert not Preferences.objects.exists()

    def test_it_rejects_a_next_page_on_another_site(self, team, client_for):
        response = client_for(team.teammate).post(self.url, {"review_shortcuts": "off", "next": "https://evil.example/"})
        assert response["Location"] == "/"
        assert not preferences_for(user=team.teammate).review_shortcuts


class TestLoginThrottle:
    """A guesser cannot try a password list against one account: after ``MAX_FAILURES`` wrong passwords
    from one address, that account's logins from that address are refused for a while, right password
    or not; another address, and the same address for another account, are not held up."""

    @pytest.mark.parametrize("url", ["/accounts/login/", "/admin/login/"])
    def test_it_refuses_after_too_many_wrong_passwords(self, team, client, url):
        admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
        get_user_model().objects.create_superuser("root-two", password=PASSWORD)
        for _attempt in range(MAX_FAILURES):
            response = client.post(url, {"username": admin.username, "password": "guess"})
            assert response.status_code == 200 and b"correct username and password" in response.content
        response = client.post(url, {"username": "ROOT", "password": PASSWORD})
        assert response.status_code == 200
        assert b"Too many failed logins" in response.content
        assert client.get("/admin/").status_code == 302
        assert Client(REMOTE_ADDR="10.0.0.9").post(url, {"username": "root", "password": PASSWORD}).status_code == 302
        assert client.post(url, {"username": "root-two", "password": PASSWORD}).status_code == 302

    def test_an_empty_password_forgives_nothing(self, team, client):
        for _attempt in range(MAX_FAILURES - 1):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        response = client.post("/accounts/login/", {"username": "alpha-owner", "password": ""})
        assert b"This field is required" in response.content
        client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        response = client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD})
        assert b"Too many failed logins" in response.content

    def test_a_right_password_forgives_the_earlier_failures(self, team, client):
        for _attempt in range(MAX_FAILURES - 1):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        assert client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD}).status_code == 302
        client.post("/accounts/logout/")
        for _attempt in range(MAX_FAILURES - 1):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        assert client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD}).status_code == 302

    def test_a_count_past_its_window_is_forgotten(self, team, client):
        for _attempt in range(MAX_FAILURES):
            client.post("/accounts/login/", {"username": "alpha-owner", "password": "guess"})
        AttemptCount.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
        client.post("/accounts/login/", {"username": "alpha-teammate", "password": "guess"})
        assert AttemptCount.objects.count() == 1  # the teammate's: the owner's past count was deleted
        assert client.post("/accounts/login/", {"username": "alpha-owner", "password": PASSWORD}).status_code == 302


class _Burst:
    """Holds every password check of a burst of parallel attempts until each attempt of the burst has
    either reached its check or been refused, so that all of them are decided while no failure has yet
    been counted: the order in which a real burst of parallel requests could run."""

    def __init__(self, size: int):
        self.size, self.decided, self.checks = size, 0, 0
        self.condition = threading.Condition()

    def decide(self) -> None:
        with self.condition:
            self.decided += 1
            self.condition.notify_all()

    def hold_check(self) -> None:
        with self.condition:
            self.checks += 1
            self.decided += 1
            self.condition.notify_all()
            # Not a timing assert: the count of checks below is what the test reads, whenever they end.
            self.condition.wait_for(lambda: self.decided >= self.size, timeout=60)

    def run(self, attempt) -> list:
        errors = []

        def one():
            try:
                form = attempt()
                if not form.is_valid():
                    errors.append(form.errors.as_data())
                    if any(error.code == "throttled" for field in form.errors.as_data().values() for error in field):
                        self.decide()
            finally:
                connection.close()

        threads = [threading.Thread(target=one) for _ in range(self.size)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return errors


@pytest.mark.django_db(transaction=True)
class TestThrottlesCountParallelAttempts:
    """A burst of parallel wrong passwords, on real threads against the database, gets no more
    than ``MAX_FAILURES`` of them checked: each attempt is counted before its password is checked."""

    burst = 3 * MAX_FAILURES

    def test_at_most_max_failures_logins_are_checked(self):
        get_user_model().objects.create_user("root", password=PASSWORD)
        burst = _Burst(self.burst)

        class HeldCheck(AuthenticationForm):
            def clean(self):
                burst.hold_check()
                return super().clean()

        class Form(ThrottledLogin, HeldCheck):
            pass

        request = RequestFactory().post("/accounts/login/")
        errors = burst.run(lambda: Form(request, data={"username": "root", "password": "guess"}))
        assert len(errors) == self.burst
        assert burst.checks == MAX_FAILURES
        assert Form(request, data={"username": "root", "password": PASSWORD}).errors["__all__"][0].startswith(
            "Too many failed logins")

    def test_at_most_max_failures_current_passwords_are_checked(self):
        user = get_user_model().objects.create_user("root", password=PASSWORD)
        burst = _Burst(self.burst)

        class HeldCheck(PasswordChangeForm):
            def clean_old_password(self):
                burst.hold_check()
                return super().clean_old_password()

        class HeldForm(ThrottledPasswordChangeForm, HeldCheck):
            pass

        data = {"old_password": "guess", "new_password1": "a-new-long-phrase", "new_password2": "a-new-long-phrase"}
        errors = burst.run(lambda: HeldForm(user, data=data))
        assert len(errors) == self.burst
        assert burst.checks == MAX_FAILURES


@pytest.mark.django_db(transaction=True)
class TestThrottlesCountAcrossProcesses:
    """Several web processes answer sign-ins (uvicorn ``--workers``, several containers): the wrong passwords
    one of them checked count in every other, so a guesser gets ``MAX_FAILURES`` in all, not that many per
    process. The guesses here are sent in a process of their own, on the same database."""

    GUESSES = """
import django
django.setup()
from django.test import RequestFactory
from webapp.accounts.throttle import MAX_FAILURES, ThrottledAuthenticationForm
request = RequestFactory().post("/accounts/login/")
for _attempt in range(MAX_FAILURES):
    form = ThrottledAuthenticationForm(request, data={"username": "root", "password": "guess"})
    assert form.errors["__all__"][0].startswith("Please enter a correct username and password"), form.errors
"""

    def test_wrong_passwords_checked_by_another_process_count_here(self):
        get_user_model().objects.create_user("root", password=PASSWORD)
        environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "webapp.settings",
                       "DATABASE_URL": database_url_for_workers(), "TEMPER_DATA": str(settings.DATA_ROOT),
                       "PYTHONPATH": str(ROOT)}
        subprocess.run([sys.executable, "-c", self.GUESSES], env=environment, cwd=ROOT, check=True)
        form = ThrottledAuthenticationForm(RequestFactory().post("/accounts/login/"),
                                           data={"username": "root", "password": PASSWORD})
        assert form.errors["__all__"][0].startswith("Too many failed logins")


class TestPasswordChangeThrottle:
    """A stolen session cannot guess the account's password on the password change page: after
    ``MAX_FAILURES`` wrong current passwords the change is refused for a while, right password or not;
    another account is not held up, and the admin site's password change leads to the same form."""

    url = "/accounts/password/"

    @staticmethod
    def change(client, old_password):
        return client.post(TestPasswordChangeThrottle.url, {"old_password": old_password,
                                                            "new_password1": "a-new-long-phrase",
                                                            "new_password2": "a-new-long-phrase"})

    def test_it_refuses_after_too_many_wrong_current_passwords(self, team, client_for):
        client = client_for(team.owner)
        for _attempt in range(MAX_FAILURES):
            response = self.change(client, "guess")
            assert response.status_code == 200 and b"old password was entered incorrectly" in response.content
        response = self.change(client, PASSWORD)
        assert response.status_code == 200
        assert b"Too many wrong current passwords for this account: wait 15 minutes" in response.content
        assert get_user_model().objects.get(username="alpha-owner").check_password(PASSWORD)
        assert self.change(client_for(team.teammate), PASSWORD).status_code == 302

    def test_a_right_password_forgives_the_earlier_failures(self, team, client_for):
        client = client_for(team.owner)
        for _attempt in range(MAX_FAILURES - 1):
            self.change(client, "guess")
        assert self.change(client, PASSWORD).status_code == 302
        for _attempt in range(MAX_FAILURES - 1):
            self.change(client, "guess")
        assert self.change(client, "a-new-long-phrase").status_code == 302

    def test_the_admin_sites_password_change_leads_to_the_throttled_form(self, team, client_for):
        admin = get_user_model().objects.create_superuser("root", password=PASSWORD)
        response = client_for(admin).get("/admin/password_change/")
        assert response.status_code == 302 and response["Location"] == self.url
