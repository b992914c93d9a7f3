"""Login, logout (POST only) and password change: Django's auth views with our
templates. Accounts are created by an administrator (``temper_setup`` or the admin
site); there is no self-service sign-up. ``review_shortcuts`` (POST) sets a person's own
preference and goes back to the page it was set from."""
from django.contrib.auth import views as auth_views
from django.urls import path, reverse_lazy

from webapp.accounts import views
from webapp.accounts.throttle import ThrottledAuthenticationForm, ThrottledPasswordChangeForm
from webapp.accounts.views import LoginView, PasswordChangeView

app_name = "accounts"

urlpatterns = [
    path(
        "login/",
        LoginView.as_view(template_name="accounts/login.html", redirect_authenticated_user=True,
                                     authentication_form=ThrottledAuthenticationForm),
        name="login",
    ),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "password/",
        PasswordChangeView.as_view(
            template_name="accounts/password_change.html",
            form_class=ThrottledPasswordChangeForm,
            success_url=reverse_lazy("accounts:password_change_done"),
        ),
        name="password_change",
    ),
    path(
        "password/done/",
        auth_views.PasswordChangeDoneView.as_view(template_name="accounts/password_change_done.html"),
        name="password_change_done",
    ),
    path("review-shortcuts/", views.review_shortcuts, name="review_shortcuts"),
]
