from django.urls import path

from webapp.review import views

app_name = "review"

urlpatterns = [
    path("p/<slug:slug>/review/", views.campaign_list, name="list"),
    path("p/<slug:slug>/review/new/", views.campaign_create, name="create"),
    path("p/<slug:slug>/review/new/generated/", views.campaign_generate, name="generate"),
    path("p/<slug:slug>/review/<str:public_id>/", views.campaign_detail, name="detail"),
    path("p/<slug:slug>/review/<str:public_id>/settings/", views.campaign_settings, name="settings"),
    path("p/<slug:slug>/review/<str:public_id>/delete/", views.campaign_delete, name="delete"),
    path("p/<slug:slug>/review/<str:public_id>/load/", views.campaign_load, name="load"),
    path("p/<slug:slug>/review/<str:public_id>/cancel/", views.generation_cancel, name="cancel"),
    path("p/<slug:slug>/review/<str:public_id>/next/", views.review_next, name="next"),
    path("p/<slug:slug>/review/<str:public_id>/change/", views.review_change, name="change"),
    path("p/<slug:slug>/review/<str:public_id>/items/", views.item_list, name="items"),
    path("p/<slug:slug>/review/<str:public_id>/conflicts/", views.conflict_list, name="conflicts"),
    path("p/<slug:slug>/review/<str:public_id>/conflicts/<str:item_id>/resolve/", views.conflict_resolve,
         name="resolve"),
    path("p/<slug:slug>/review/<str:public_id>/export/", views.export_create, name="export"),
]
