from django.urls import path

from webapp.activity import views

app_name = "activity"

urlpatterns = [
    path("p/<slug:slug>/activity/", views.activity_list, name="list"),
]
