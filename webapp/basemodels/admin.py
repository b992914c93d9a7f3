from django.contrib import admin

from webapp.basemodels.models import BaseModel


@admin.register(BaseModel)
class BaseModelAdmin(admin.ModelAdmin):
    list_display = ["name", "project", "architecture", "parameter_count", "public_id", "created_at"]
    list_filter = ["architecture"]
    search_fields = ["name", "public_id", "path"]
