from __future__ import annotations

from django import forms
from django.contrib.auth import get_user_model

from webapp.projects.models import DESCRIPTION_MAX_CHARS, Project, Role


class ProjectCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    slug = forms.CharField(
        max_length=50,
        required=False,
        help_text="Used in URLs: lower-case letters, digits and hyphens, e.g. chat-tuning. Blank: made from the name.",
    )


class ProjectSettingsForm(forms.Form):
    # Neither required nor limited here: a blank or long name is the service's to refuse, in the words the API gives
    # too (the browser still asks for one, of at most 100 characters, first).
    name = forms.CharField(required=False, widget=forms.TextInput(attrs={
        "required": True, "maxlength": Project._meta.get_field("name").max_length}))
    # Its length is the service's to check: a browser sends each line break as two characters (CRLF).
    description = forms.CharField(
        required=False, widget=forms.Textarea(attrs={"rows": 5}),
        help_text=f"What the project is for, at most {DESCRIPTION_MAX_CHARS:,} characters. Shown as plain text under "
                  "its name (line breaks kept, no Markdown) and, its first words, in the project list.")


class MemberAddForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices, initial=Role.MEMBER)

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=username, is_active=True).first()
        if user is None:
            # Temper has no sign-up page: a newcomer's account is made by an administrator first.
            raise forms.ValidationError(
                f"no active user is named {username!r}; check the spelling. Someone new needs an account first, "
                "and only an administrator makes accounts: in the admin site (/admin/auth/user/add/) or, on the "
                "server, with manage.py createsuperuser for another administrator")
        self.cleaned_data["user"] = user
        return username


class MemberRoleForm(forms.Form):
    username = forms.CharField(max_length=150)
    role = forms.ChoiceField(choices=Role.choices)


class MemberRemoveForm(forms.Form):
    username = forms.CharField(max_length=150)
