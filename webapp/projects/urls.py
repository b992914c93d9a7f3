from django.urls import path

from webapp.projects import views

app_name = "projects"

urlpatterns = [
    path("", views.project_list, name="list"),
    path("projects/new/", views.project_create, name="create"),
    path("p/<slug:slug>/", views.project_detail, name="detail"),
    path("p/<slug:slug>/settings/", views.project_settings, name="settings"),
    path("p/<slug:slug>/delete/", views.project_delete, name="delete"),
    path("p/<slug:slug>/members/", views.members, name="members"),
    path("p/<slug:slug>/storage/", views.storage, name="storage"),
    path("p/<slug:slug>/storage/prune/", views.storage_prune, name="storage_prune"),
    path("p/<slug:slug>/storage/prune/state/", views.storage_prune_state, name="storage_prune_state"),
    path("p/<slug:slug>/members/role/", views.member_set_role, name="member_role"),
    path("p/<slug:slug>/members/remove/", views.member_remove, name="member_remove"),
]
