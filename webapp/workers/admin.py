from django.contrib import admin

from webapp.workers.models import Worker


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ["name", "host", "pid", "last_seen", "stopped_at"]
