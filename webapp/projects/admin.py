from django.contrib import admin
from django.urls import reverse
from django.utils.html import format_html

from webapp.projects.models import Membership, Project


class MembershipInline(admin.TabularInline):
    """Adds members (an owner for a project whose owners have left, say); existing memberships are read-only
    here. Removals and role changes go through the project's Members page, whose services keep an owner and
    take the member off the campaigns' reviewers and revoke their project tokens; deleted here, they did not."""

    model = Membership
    extra = 0
    autocomplete_fields = ["user"]
    can_delete = False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]

    def get_readonly_fields(self, request, obj=None):
        # A slug is fixed once the project exists: it names the project's folder of the models root
        # (projects/<slug>/), where its registered models' stored paths point. Renamed, the folder would keep the
        # old name, and the next project given that slug would see the models in it.
        # The name and the description change on the project's Settings page alone (services.project_update): saved
        # here, they skipped its checks (invisible characters, length) and left no entry in the activity log.
        return ["slug", "name", "description", "settings_page"] if obj is not None else []

    def get_fields(self, request, obj=None):
        return ["name", "slug", "description", "settings_page"] if obj is not None else ["name", "slug",
                                                                                        "description"]

    @admin.display(description="Rename or describe")
    def settings_page(self, project: Project) -> str:
        address = reverse("projects:settings", args=[project.slug])
        return format_html('on the project\'s <a href="{}">Settings page</a> (owners), which checks the name and '
                           'logs the change in its activity log', address)
