from django.urls import path

from webapp.runs import events, views

app_name = "runs"

urlpatterns = [
    path("p/<slug:slug>/runs/", views.run_list, name="list"),
    path("p/<slug:slug>/runs/new/", views.run_create, name="new"),
    path("p/<slug:slug>/runs/new/check/", views.run_check, name="check"),
    path("p/<slug:slug>/runs/archive/", views.run_archive, name="archive"),
    path("p/<slug:slug>/runs/compare/", views.run_compare, name="compare"),
    path("p/<slug:slug>/runs/compare/metrics.csv", views.run_compare_csv, name="compare_csv"),
    path("p/<slug:slug>/pipelines/new/", views.pipeline_create, name="pipeline_new"),
    path("p/<slug:slug>/pipelines/<str:pipeline_id>/", views.pipeline_detail, name="pipeline"),
    path("p/<slug:slug>/pipelines/<str:pipeline_id>/cancel/", views.pipeline_cancel, name="pipeline_cancel"),
    path("p/<slug:slug>/runs/<str:run_id>/", views.run_detail, name="detail"),
    path("p/<slug:slug>/runs/<str:run_id>/state.json", views.run_state, name="state"),
    path("p/<slug:slug>/runs/<str:run_id>/events/", events.run_events, name="events"),
    path("p/<slug:slug>/runs/<str:run_id>/samples/", views.run_samples, name="samples"),
    path("p/<slug:slug>/runs/<str:run_id>/cancel/", views.run_cancel, name="cancel"),
    path("p/<slug:slug>/runs/<str:run_id>/resume/", views.run_resume, name="resume"),
    path("p/<slug:slug>/runs/<str:run_id>/retry/", views.run_retry, name="retry"),
    path("p/<slug:slug>/runs/<str:run_id>/delete/", views.run_delete, name="delete"),
    path("p/<slug:slug>/runs/<str:run_id>/edit/", views.run_edit, name="edit"),
    path("p/<slug:slug>/runs/<str:run_id>/export/", views.run_export_checkpoint, name="export_checkpoint"),
    path("p/<slug:slug>/runs/<str:run_id>/checkpoints/", views.run_checkpoints, name="checkpoints"),
    path("p/<slug:slug>/runs/<str:run_id>/checkpoints/delete/", views.run_checkpoint_delete, name="checkpoint_delete"),
    path("p/<slug:slug>/runs/<str:run_id>/checkpoints/prune/", views.run_checkpoints_prune, name="checkpoints_prune"),
    path("p/<slug:slug>/runs/<str:run_id>/checkpoints/serving-copy/", views.run_checkpoint_serving_copy,
         name="checkpoint_serving_copy"),
    path("p/<slug:slug>/runs/<str:run_id>/serving-copy/", views.run_serving_copy, name="serving_copy"),
    path("p/<slug:slug>/runs/<str:run_id>/artifacts/<str:kind>/", views.run_artifact, name="artifact"),
    path("p/<slug:slug>/runs/<str:run_id>/artifacts/<str:kind>/card/", views.run_artifact_card, name="artifact_card"),
]
