from django.urls import path

from webapp.evals import views

app_name = "evals"

urlpatterns = [
    path("p/<slug:slug>/evaluations/", views.evaluation_list, name="list"),
    path("p/<slug:slug>/evaluations/new/", views.evaluation_create, name="create"),
    path("p/<slug:slug>/evaluations/<str:public_id>/", views.evaluation_detail, name="detail"),
    path("p/<slug:slug>/evaluations/<str:public_id>/cancel/", views.evaluation_cancel, name="cancel"),
    path("p/<slug:slug>/evaluations/<str:public_id>/delete/", views.evaluation_delete, name="delete"),
]
