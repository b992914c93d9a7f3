from django.urls import path

from webapp.datasets import views

app_name = "datasets"

urlpatterns = [
    path("p/<slug:slug>/datasets/", views.dataset_list, name="list"),
    path("p/<slug:slug>/datasets/new/", views.dataset_upload, name="upload"),
    path("p/<slug:slug>/datasets/<str:public_id>/", views.dataset_detail, name="detail"),
    path("p/<slug:slug>/datasets/<str:public_id>/upload/", views.version_upload, name="version_upload"),
    path("p/<slug:slug>/datasets/<str:public_id>/delete/", views.dataset_delete, name="delete"),
    path("p/<slug:slug>/datasets/<str:public_id>/about/", views.dataset_about, name="about"),
    path("p/<slug:slug>/datasets/<str:public_id>/compare/", views.version_compare, name="compare"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/", views.version_detail, name="version"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/download/", views.version_download, name="download"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/split/", views.version_split, name="split"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/dedupe/", views.version_derive, {"kind": "dedupe"},
         name="dedupe"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/decontaminate/", views.version_derive,
         {"kind": "decontaminate"}, name="decontaminate"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/requeue/", views.version_requeue, name="requeue"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/delete/", views.version_delete,
         name="version_delete"),
    path("p/<slug:slug>/datasets/<str:public_id>/v/<int:number>/tokens/", views.version_token_statistics,
         name="tokens"),
]
