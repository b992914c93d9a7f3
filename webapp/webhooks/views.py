"""The project's Webhooks page (``/p/<slug>/webhooks/``), owners only: members and viewers get 403 as on the other
owner-only pages. Not even a read-only list for them: a Slack, Mattermost or Discord hook's address is a secret
itself (whoever has it posts to the channel), and so is the signing secret the page shows."""
from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import ValidationError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_http_methods, require_POST

from webapp.core.forms import add_service_errors
from webapp.core.submissions import form_send_once
from webapp.projects.access import get_project_for_user
from webapp.projects.models import Role
from webapp.webhooks import selectors, services
from webapp.webhooks.forms import WebhookForm
from webapp.webhooks.models import DeliveryStatus, WebhookDelivery


def _owned(request: HttpRequest, slug: str):
    return get_project_for_user(request.user, slug, min_role=Role.OWNER)


def _list_page(request, slug: str, webhook_id: str = "") -> str:
    return reverse("webhooks:list", args=[slug]) + (f"#{webhook_id}" if webhook_id else "")


@login_required
@require_http_methods(["GET", "POST"])
def webhook_list(request: HttpRequest, slug: str) -> HttpResponse:
    """The hooks with their newest deliveries; a POST adds one."""
    project, membership = _owned(request, slug)
    form = WebhookForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        def create() -> str:
            webhook = services.webhook_create(project=project, user=request.user,
                                              site_url=services.served_at(request),
                                              **form.cleaned_data)
            messages.success(request, f"Webhook {webhook.public_id} added: use Send test to check it.")
            return _list_page(request, slug, webhook.public_id)

        try:
            return redirect(form_send_once(request, create=create))
        except ValidationError as error:
            add_service_errors(form, error)
    return render(request, "webhooks/list.html", {
        "project": project, "membership": membership, "rows": selectors.webhook_rows(project=project), "form": form,
        "base_url_setting": settings.TEMPER_BASE_URL}, status=400 if form.errors else 200)


@login_required
@require_http_methods(["GET", "POST"])
def webhook_edit(request: HttpRequest, slug: str, webhook_id: str) -> HttpResponse:
    project, membership = _owned(request, slug)
    webhook = selectors.webhook_get(project=project, public_id=webhook_id)
    initial = {"url": webhook.url, "events": webhook.events, "format": webhook.format, "active": webhook.active}
    form = WebhookForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        try:
            services.webhook_update(webhook=webhook, user=request.user, site_url=services.served_at(request),
                                    **form.cleaned_data)
        except ValidationError as error:
            add_service_errors(form, error)
        else:
            messages.success(request, f"Webhook {webhook.public_id} saved.")
            return redirect(_list_page(request, slug, webhook.public_id))
    return render(request, "webhooks/edit.html", {"project": project, "membership": membership,
                                                  "webhook": webhook, "form": form},
                  status=400 if form.errors else 200)


@login_required
@require_POST
def webhook_delete(request: HttpRequest, slug: str, webhook_id: str) -> HttpResponse:
    project, _membership = _owned(request, slug)
    webhook = selectors.webhook_get(project=project, public_id=webhook_id)
    services.webhook_delete(webhook=webhook, user=request.user)
    messages.success(request, f"Webhook {webhook_id} deleted with its deliveries.")
    return redirect(_list_page(request, slug))


@login_required
@require_POST
def webhook_secret(request: HttpRequest, slug: str, webhook_id: str) -> HttpResponse:
    project, _membership = _owned(request, slug)
    webhook = services.webhook_secret_regenerate(webhook=selectors.webhook_get(project=project, public_id=webhook_id),
                                                 user=request.user)
    messages.success(request, f"Webhook {webhook.public_id} has a new secret: messages from now on are signed with "
                              "it; update your receiver.")
    return redirect(_list_page(request, slug, webhook.public_id))


def _said(request: HttpRequest, what: str, delivery: WebhookDelivery) -> None:
    """The outcome of a delivery sent from the page, as a message."""
    if delivery.status == DeliveryStatus.DELIVERED:
        messages.success(request, f"{what} delivered: HTTP {delivery.last_status_code}.")
        return
    retry = (f"; tried again at {delivery.next_attempt_at:%H:%M:%S} UTC by a worker"
             if delivery.status == DeliveryStatus.PENDING and delivery.next_attempt_at else "")
    messages.error(request, f"{what} not delivered: {delivery.last_error or 'no answer'}{retry}.")


@login_required
@require_POST
def webhook_test(request: HttpRequest, slug: str, webhook_id: str) -> HttpResponse:
    """Send test: a ``ping`` sent now, its answer shown at once."""
    project, _membership = _owned(request, slug)
    webhook = selectors.webhook_get(project=project, public_id=webhook_id)
    try:
        _said(request, "Test message", services.webhook_ping(webhook=webhook))
    except ValidationError as error:
        messages.error(request, " ".join(error.messages))
    return redirect(_list_page(request, slug, webhook.public_id))


@login_required
@require_POST
def delivery_redeliver(request: HttpRequest, slug: str, webhook_id: str, delivery_id: str) -> HttpResponse:
    project, _membership = _owned(request, slug)
    webhook = selectors.webhook_get(project=project, public_id=webhook_id)
    delivery = selectors.delivery_get(webhook=webhook, public_id=delivery_id)
    _said(request, f"{delivery.event} sent again", services.delivery_redeliver(delivery=delivery))
    return redirect(_list_page(request, slug, webhook.public_id))
