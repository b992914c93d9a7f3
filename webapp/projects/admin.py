from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.options import IS_POPUP_VAR
from django.contrib.admin.widgets import AutocompleteSelect
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied, ValidationError
from django.db import transaction
from django.urls import reverse
from django.utils.html import format_html

from webapp.core.forms import add_service_errors
from webapp.projects import services
from webapp.projects.forms import ProjectCreateForm
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


class ProjectAddForm(ProjectCreateForm):
    """The projects page's form and the owner it makes: staff create a project for someone (with
    ``TEMPER_PROJECT_CREATORS=staff``, the person the 403 page told to ask an administrator)."""

    def __init__(self, *args, admin_site: admin.AdminSite, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["owner"] = forms.ModelChoiceField(
            queryset=get_user_model().objects.filter(is_active=True),
            widget=AutocompleteSelect(Membership._meta.get_field("user"), admin_site),
            help_text="The project's first owner, who adds its other members on its Members page.")


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    search_fields = ["name", "slug"]
    inlines = [MembershipInline]
    # The change page's; the add page is add_view's.
    fields = ["name", "slug", "description", "settings_page"]
    # A slug is fixed once the project exists: it names the project's folder of the models root (projects/<slug>/),
    # where its registered models' stored paths point. Renamed, the folder would keep the old name, and the next
    # project given that slug would see the models in it.
    # The name and the description change on the project's Settings page alone (services.project_update): saved here,
    # they skipped its checks (invisible characters, length) and left no entry in the activity log.
    readonly_fields = ["slug", "name", "description", "settings_page"]

    def add_view(self, request, form_url="", extra_context=None):
        # Saved by the admin's own form, a project skipped services.project_create: no slug rules, reserved names or
        # left-over models folder refused, and no owner until a membership was added below. The service's refusals
        # show on the form, next to the field they name, and nothing is saved.
        if not self.has_add_permission(request):
            raise PermissionDenied
        form = ProjectAddForm(request.POST or None, admin_site=self.admin_site)
        if request.method == "POST" and form.is_valid():
            try:
                with transaction.atomic():
                    project = services.project_create(name=form.cleaned_data["name"], slug=form.cleaned_data["slug"],
                                                      owner=form.cleaned_data["owner"])
            except ValidationError as error:
                add_service_errors(form, error)
            else:
                self.log_addition(request, project, [{"added": {}}])
                return self.response_add(request, project)
        admin_form = helpers.AdminForm(form, [(None, {"fields": ["name", "slug", "owner"]})], {}, model_admin=self)
        context = {**self.admin_site.each_context(request), "title": f"Add {self.opts.verbose_name}",
                   "adminform": admin_form, "object_id": None, "original": None, "to_field": None,
                   "is_popup": IS_POPUP_VAR in request.POST or IS_POPUP_VAR in request.GET,
                   "media": self.media + admin_form.media, "inline_admin_formsets": [],
                   "errors": helpers.AdminErrorList(form, []), "preserved_filters": self.get_preserved_filters(request),
                   **(extra_context or {})}
        return self.render_change_form(request, context, add=True, form_url=form_url)

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
