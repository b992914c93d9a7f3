from django.urls import path

from webapp.basemodels import views

app_name = "basemodels"

urlpatterns = [
    path("p/<slug:slug>/models/", views.basemodel_list, name="list"),
    path("p/<slug:slug>/models/register/", views.basemodel_register, name="register"),
    path("p/<slug:slug>/models/upload/", views.basemodel_upload, name="upload"),
    path("p/<slug:slug>/models/<str:public_id>/", views.basemodel_detail, name="detail"),
    path("p/<slug:slug>/models/<str:public_id>/delete/", views.basemodel_delete, name="delete"),
    path("p/<slug:slug>/models/<str:public_id>/serving-copy/", views.basemodel_serving_copy, name="serving_copy"),
]
