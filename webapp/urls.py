from django.contrib import admin
from django.urls import include, path

from webapp.core import views as core_views

urlpatterns = [
    path("healthz", core_views.healthz, name="healthz"),
    path("admin/", admin.site.urls),
    path("accounts/", include("webapp.accounts.urls")),
    path("", include("webapp.projects.urls")),
    path("", include("webapp.basemodels.urls")),
]
