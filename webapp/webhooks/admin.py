from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from webapp.webhooks.models import Webhook, WebhookDelivery


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """Read-only: a hook decides where a project's data is sent, so each change goes through ``webhooks.services``
    on the project's Webhooks page, which checks the address and the events and records it in the project's
    activity log; saved here, none of that happened (and a hook could move to another project)."""

    list_display = ("public_id", "project", "url", "format", "active", "created_at")
    exclude = ("secret",)  # shown to the project's owners on its Webhooks page, not in the admin's lists
    readonly_fields = ("webhooks_page",)

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="Add, change or delete")
    def webhooks_page(self, webhook: Webhook) -> str:
        address = reverse("webhooks:list", args=[webhook.project.slug])
        return format_html('on the project\'s <a href="{}">Webhooks page</a> (owners), which checks the address and '
                           'the events and records each change in its activity log', address)


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """Read-only: a delivery is the record of what was sent where and what the receiver answered, which the project's
    Webhooks page lists and whose payload its Redeliver sends again; changed here, it would say what never
    happened."""

    list_display = ("public_id", "webhook", "event", "status", "attempts", "last_status_code", "created_at")
    list_filter = ("status", "event")

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
