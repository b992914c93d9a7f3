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

    def has_delete_permission(self, request, obj=None):
        # Deleted here, a project skipped services.project_delete: no refusal while its work is in flight, and its
        # dataset files and run directories stayed on disk. Its Settings page's danger zone deletes it (an
        # administrator adds themselves as an owner below first, for a project whose owners have left).
        return False

    @admin.display(description="Rename, describe or delete")
    def settings_page(self, project: Project) -> str:
        address = reverse("projects:settings", args=[project.slug])
        return format_html('on the project\'s <a href="{}">Settings page</a> (owners; deleting in its danger zone), '
                           'which checks the name, logs the change in its activity log and removes a deleted '
                           'project\'s files', address)
