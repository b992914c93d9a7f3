from django.urls import path

from webapp.webhooks import views

app_name = "webhooks"

urlpatterns = [
    path("p/<slug:slug>/webhooks/", views.webhook_list, name="list"),
    path("p/<slug:slug>/webhooks/<str:webhook_id>/", views.webhook_edit, name="edit"),
    path("p/<slug:slug>/webhooks/<str:webhook_id>/delete/", views.webhook_delete, name="delete"),
    path("p/<slug:slug>/webhooks/<str:webhook_id>/secret/", views.webhook_secret, name="secret"),
    path("p/<slug:slug>/webhooks/<str:webhook_id>/test/", views.webhook_test, name="test"),
    path("p/<slug:slug>/webhooks/<str:webhook_id>/deliveries/<str:delivery_id>/redeliver/",
         views.delivery_redeliver, name="redeliver"),
]
