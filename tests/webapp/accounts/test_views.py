"""Login, logout and password change."""
from django.contrib.auth import get_user_model

from tests.webapp.factories import PASSWORD


class TestLogin:
    url = "/accounts/login/"

    def test_it_works(self, team, client):
        assert client.get(self.url).status_code == 200
        response = client.post(self.url, {"username": "alpha-owner", "password": PASSWORD, "next": "/p/alpha/"})
        assert response.status_code == 302
        assert response["Location"] == "/p/alpha/"
        assert client.get("/p/alpha/").status_code == 200

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
