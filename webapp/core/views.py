import logging
from collections.abc import Callable
from functools import wraps

from django.conf import settings
from django.core.exceptions import DisallowedHost, RequestDataTooBig, TooManyFieldsSent, TooManyFilesSent
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, JsonResponse
from django.http.multipartparser import MultiPartParserError
from django.http.request import split_domain_port
from django.shortcuts import redirect, render
from django.template.defaultfilters import filesizeformat
from django.urls import Resolver404
from django.views import defaults

logger = logging.getLogger(__name__)


def healthz(request: HttpRequest) -> JsonResponse:
    """Liveness probe for compose and load balancers: no database, no login."""
    return JsonResponse({"status": "ok"})


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """A refused form in Temper's own 403 page (settings.CSRF_FAILURE_VIEW). Django's page is a bare
    one that speaks of Referer headers and cookies; what a person mostly hit is a form left open
    across a new login (a new token), and what helps is to reload it and submit again. Under
    ``TEMPER_HTTPS=1`` a form that came as plain HTTP fails whatever is reloaded (its https Origin is not
    this server's, its Secure cookie was not sent): the setup is at fault, and the page says which settings
    to set, the log which address to list (an address of the server's network is not for every visitor)."""
    if settings.SERVED_OVER_HTTPS and not request.is_secure():
        peer = request.META.get("REMOTE_ADDR", "")
        logger.warning("a form reached Temper as plain HTTP from %s under TEMPER_HTTPS=1: if %s is a proxy serving "
                       "HTTPS, list it in TEMPER_TRUSTED_PROXIES and have it set X-Forwarded-Proto", peer, peer)
        message = ("This form could not be accepted: Temper is set to be served over HTTPS (TEMPER_HTTPS=1), but this "
                   "request reached it as plain HTTP. If a reverse proxy serves HTTPS in front of Temper, an "
                   "administrator must list that proxy's address in TEMPER_TRUSTED_PROXIES (the server's log names "
                   "the address this request came from) and have it set X-Forwarded-Proto; if Temper serves HTTPS "
                   "itself, open its https:// address; if it is not served over HTTPS, set TEMPER_HTTPS=0.")
        return render(request, "403.html", {"exception": message}, status=403)
    message = (f"This form could not be accepted: its security token is missing or out of date ({reason.rstrip('.')}). "
               "This happens when the page was opened before you logged in again, or in another tab. "
               "Go back, reload the page and submit it again.")
    return render(request, "403.html", {"exception": message}, status=403)


def json_api_at(path: str) -> str | None:
    """The JSON API an address belongs to, so that its errors come in that API's shape: ``"rest"``
    under ``/api``, ``"openai"`` under ``/v1``, each address itself included (a client given the base URL
    asks it as it is); None for the pages."""
    for prefix, api in (("/api", "rest"), ("/v1", "openai")):
        if path == prefix or path.startswith(prefix + "/"):
            return api
    return None


def page_not_found(request: HttpRequest, exception: Exception) -> HttpResponse:
    """404 for an address no view answers (settings' ``handler404``): under the REST API and the
    OpenAI-compatible API it is JSON in that API's error shape, naming where the endpoints are, since the
    program that mistyped an endpoint reads JSON; everywhere else it is the 404 page."""
    api = json_api_at(request.path)
    if api == "rest":
        return JsonResponse({"detail": f"no API endpoint at {request.path}; "
                                       "the endpoints are listed in /api/v1/openapi.json"}, status=404)
    if api == "openai":
        return JsonResponse({"error": {
            "message": f"no endpoint at {request.path}; the OpenAI-compatible API answers GET /v1/models, "
                       "POST /v1/chat/completions and POST /v1/completions",
            "type": "invalid_request_error", "param": None, "code": "not_found"}}, status=404)
    return render(request, "404.html", {"message": not_found_message(exception)}, status=404)


def not_found_message(exception: Exception) -> str:
    """What a view's ``Http404`` says is missing ("no such run in this project"), for the 404 page to show; ""
    where it says nothing a person can read: an address no view answers (a ``Resolver404``, whose argument is the
    patterns tried) or a bare ``Http404``. The messages raised before a user is known to be a member name nothing
    of the project asked for ("no such project"), so that showing them tells an outsider nothing."""
    if isinstance(exception, Resolver404) or not exception.args:
        return ""
    message = exception.args[0]
    return message if isinstance(message, str) else ""


SERVER_ERROR = ("the server failed on this request; the error has been logged: try again, and tell an administrator "
                "if it goes on")


def server_error(request: HttpRequest) -> HttpResponse:
    """500 for a request a view failed on (settings' ``handler500``): under the REST API and the
    OpenAI-compatible API it is JSON in that API's error shape (the HTML page reached the openai client as
    the error's message); everywhere else the 500 page. What failed stays in the log."""
    api = json_api_at(request.path)
    if api == "rest":
        return JsonResponse({"detail": SERVER_ERROR}, status=500)
    if api == "openai":
        return JsonResponse({"error": {"message": SERVER_ERROR, "type": "server_error", "param": None, "code": None}},
                            status=500)
    return defaults.server_error(request)


def _unreadable_body(exception: Exception | None) -> tuple[int, str, str]:
    """(status, heading, what was wrong) for a body Django refused before the view could read it."""
    if isinstance(exception, RequestDataTooBig):
        limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        return 413, "The form is too large", (
            f"What was sent is over the {filesizeformat(limit)} ({limit} bytes) a form may hold "
            "(DATA_UPLOAD_MAX_MEMORY_SIZE; files are not counted). Go back and shorten the longest text: "
            "notes and guidelines hold 20,000 characters at most.")
    if isinstance(exception, MultiPartParserError) and "header size" in str(exception):
        # Django reads at most 1,024 bytes of a part's headers, where a file's name is sent.
        return 400, "The form could not be read", (
            "the body could not be read: a part's headers are over 1,024 bytes, most likely the file name; "
            "rename the file to a shorter name and send it again")
    if isinstance(exception, (MultiPartParserError, TooManyFieldsSent, TooManyFilesSent)):
        return 400, "The form could not be read", f"the body could not be read: {exception}"
    return 400, "The request could not be read", "the request could not be read (a header or the body is malformed)"


def _unknown_host(request: HttpRequest) -> str:
    """Why a request to a host name outside ``ALLOWED_HOSTS`` was refused, and the setting that admits it: the
    first visit after ``TEMPER_HOST=0.0.0.0 make up``, at the machine's address, was told its request was
    malformed. Only a valid host name is repeated (the page escapes it; the header is the sender's)."""
    domain, _port = split_domain_port(request.META.get("HTTP_HOST", ""))
    if not domain:
        return "the Host header of this request is not a host name"
    return (f"this server does not answer to the host name {domain!r}: add it to TEMPER_ALLOWED_HOSTS "
            "(a comma-separated list, in the environment Temper starts in) and start Temper again")


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    """400 (413 for a form past ``DATA_UPLOAD_MAX_MEMORY_SIZE``) for a request Django refused before a view
    read it (settings' ``handler400``): a multipart body without a boundary or with one of 300 characters,
    a file name past the parser's limit, too many fields, a host name outside ``TEMPER_ALLOWED_HOSTS``. Under
    the REST API and the OpenAI-compatible API it is JSON in that API's error shape; everywhere else a page
    saying what was wrong (it was Django's bare "Bad Request (400)"). A message of any other
    ``SuspiciousOperation`` is not repeated."""
    if isinstance(exception, DisallowedHost):
        status, heading, message = 400, "Unknown host name", _unknown_host(request)
    else:
        status, heading, message = _unreadable_body(exception)
    api = json_api_at(request.path)
    if api is not None and isinstance(exception, RequestDataTooBig):  # a program's body, not a page's form
        message = (f"the body is over the {settings.DATA_UPLOAD_MAX_MEMORY_SIZE} bytes a request's body may hold "
                   "(DATA_UPLOAD_MAX_MEMORY_SIZE); send a smaller one (a dataset's file, sent as a multipart upload, "
                   "is not counted)")
    if api == "rest":
        return JsonResponse({"detail": message}, status=status)
    if api == "openai":
        return JsonResponse({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                       "code": "request_too_large" if status == 413 else "bad_request"}},
                            status=status)
    return render(request, "400.html", {"heading": heading, "message": message,
                                        "from_a_form": not isinstance(exception, DisallowedHost)}, status=status)


def post_answered_with_a_page(page: str) -> Callable:
    """``require_POST`` for a view whose answer is a page at its own address (a refused form shown again,
    a secret shown once): a GET of that address (the address bar after a reload, a bookmark, a restored
    tab) goes to URL ``page``, with the same arguments, instead of a blank 405."""
    def decorate(view: Callable) -> Callable:
        @wraps(view)
        def wrapped(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method in ("GET", "HEAD"):
                return redirect(page, *args, **kwargs)
            if request.method != "POST":
                return HttpResponseNotAllowed(["GET", "POST"])
            return view(request, *args, **kwargs)
        return wrapped
    return decorate
