from django.contrib import admin

from webapp.webhooks.models import Webhook, WebhookDelivery


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    list_display = ("public_id", "project", "url", "format", "active", "created_at")
    exclude = ("secret",)  # shown to the project's owners on its Webhooks page, not in the admin's lists


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    list_display = ("public_id", "webhook", "event", "status", "attempts", "last_status_code", "created_at")
    list_filter = ("status", "event")
