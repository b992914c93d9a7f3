from django.urls import path

from webapp.api import token_views, views

app_name = "api"

base = "api/v1/projects/<slug:slug>"
urlpatterns = [
    path("api/v1/openapi.json", views.openapi, name="openapi"),
    path("api/v1/projects/", views.projects, name="projects"),
    path(f"{base}/", views.project_detail, name="project"),
    path(f"{base}/storage/", views.storage, name="storage"),
    path(f"{base}/storage/prune/", views.storage_prune, name="storage_prune"),
    path(f"{base}/base-models/", views.base_models, name="base_models"),
    path(f"{base}/base-models/<str:model_id>/", views.base_model_detail, name="base_model"),
    path(f"{base}/datasets/", views.datasets, name="datasets"),
    path(f"{base}/datasets/<str:dataset_id>/", views.dataset_detail, name="dataset"),
    path(f"{base}/datasets/<str:dataset_id>/compare/", views.dataset_compare, name="dataset_compare"),
    path(f"{base}/datasets/<str:dataset_id>/versions/<int:number>/", views.dataset_version, name="dataset_version"),
    path(f"{base}/datasets/<str:dataset_id>/versions/<int:number>/file/", views.dataset_version_file,
         name="dataset_version_file"),
    # By the dv_… id a run's spec names (the address above names a version by its dataset and number).
    path(f"{base}/dataset-versions/<str:version_id>/", views.dataset_version_by_id, name="dataset_version_by_id"),
    path(f"{base}/runs/", views.runs, name="runs"),
    path(f"{base}/runs/<str:run_id>/", views.run_detail, name="run"),
    path(f"{base}/runs/<str:run_id>/cancel/", views.run_cancel, name="run_cancel"),
    path(f"{base}/runs/<str:run_id>/resume/", views.run_resume, name="run_resume"),
    path(f"{base}/runs/<str:run_id>/retry/", views.run_retry, name="run_retry"),
    path(f"{base}/runs/<str:run_id>/duplicate/", views.run_duplicate, name="run_duplicate"),
    path(f"{base}/runs/<str:run_id>/finish/", views.run_finish, name="run_finish"),
    path(f"{base}/runs/<str:run_id>/metrics/", views.run_metrics, name="run_metrics"),
    path(f"{base}/runs/<str:run_id>/samples/", views.run_samples, name="run_samples"),
    path(f"{base}/runs/<str:run_id>/logs/", views.run_logs, name="run_logs"),
    path(f"{base}/runs/<str:run_id>/artifacts/<str:kind>/", views.run_artifact, name="run_artifact"),
    path(f"{base}/runs/<str:run_id>/artifacts/<str:kind>/card/", views.run_artifact_card, name="run_artifact_card"),
    path(f"{base}/runs/<str:run_id>/checkpoints/", views.run_checkpoints, name="run_checkpoints"),
    path(f"{base}/runs/<str:run_id>/checkpoints/<int:step>/", views.run_checkpoint, name="run_checkpoint"),
    path(f"{base}/runs/<str:run_id>/checkpoints/<int:step>/export/", views.run_checkpoint_export,
         name="run_checkpoint_export"),
    path(f"{base}/runs/<str:run_id>/checkpoints/<int:step>/serving-copy/", views.run_checkpoint_serving_copy,
         name="run_checkpoint_serving_copy"),
    path(f"{base}/runs/<str:run_id>/checkpoints/prune/", views.run_checkpoints_prune, name="run_checkpoints_prune"),
    path(f"{base}/activity/", views.activity, name="activity"),
    path(f"{base}/pipelines/", views.pipelines, name="pipelines"),
    path(f"{base}/pipelines/<str:pipeline_id>/", views.pipeline_detail, name="pipeline"),
    path(f"{base}/pipelines/<str:pipeline_id>/cancel/", views.pipeline_cancel, name="pipeline_cancel"),
    path(f"{base}/webhooks/", views.webhooks, name="webhooks"),
    path(f"{base}/webhooks/<str:webhook_id>/", views.webhook_detail, name="webhook"),
    path(f"{base}/webhooks/<str:webhook_id>/secret/", views.webhook_secret, name="webhook_secret"),
    path(f"{base}/webhooks/<str:webhook_id>/test/", views.webhook_test, name="webhook_test"),
    path(f"{base}/webhooks/<str:webhook_id>/deliveries/", views.webhook_deliveries, name="webhook_deliveries"),
    path(f"{base}/webhooks/<str:webhook_id>/deliveries/<str:delivery_id>/redeliver/", views.webhook_redeliver,
         name="webhook_redeliver"),
    # Tokens of the OpenAI-compatible API (/v1/), made with a REST token as on the Chat page.
    path(f"{base}/chat-tokens/", views.chat_tokens, name="chat_tokens"),
    path(f"{base}/chat-tokens/<int:token_id>/", views.chat_token, name="chat_token"),
    path("accounts/tokens/", token_views.token_list, name="tokens"),
    path("accounts/tokens/<int:token_id>/revoke/", token_views.token_revoke, name="token_revoke"),
]
