from django.contrib import admin
from django.urls import include, path
from django.views.generic import RedirectView

from webapp.accounts.throttle import ThrottledAdminAuthenticationForm
from webapp.core import views as core_views
from webapp.core.metrics import metrics_view

admin.site.login_form = ThrottledAdminAuthenticationForm  # see webapp.accounts.throttle

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # The admin site's own password change form is not throttled: its page leads to ours, which is.
    path("admin/password_change/", RedirectView.as_view(pattern_name="accounts:password_change"),
         name="admin_password_change"),
    path("admin/", admin.site.urls),
    path("accounts/", include("webapp.accounts.urls")),
    path("", include("webapp.projects.urls")),
    path("", include("webapp.basemodels.urls")),
    path("", include("webapp.datasets.urls")),
    path("", include("webapp.workers.urls")),
    path("", include("webapp.runs.urls")),
    path("", include("webapp.api.urls")),
    path("", include("webapp.review.urls")),
    path("", include("webapp.evals.urls")),
    path("", include("webapp.chat.urls")),
    path("", include("webapp.webhooks.urls")),
    path("", include("webapp.activity.urls")),
]

handler400 = core_views.bad_request
handler404 = core_views.page_not_found
handler500 = core_views.server_error
