from django.contrib import admin

from webapp.datasets.models import Dataset, DatasetVersion


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ("name", "kind", "project", "public_id", "created_at")
    list_filter = ("kind",)
    search_fields = ("name", "public_id")


@admin.register(DatasetVersion)
class DatasetVersionAdmin(admin.ModelAdmin):
    list_display = ("dataset", "number", "status", "format", "row_count", "error_count", "created_at")
    list_filter = ("status", "format")
    readonly_fields = [field.name for field in DatasetVersion._meta.fields]
