"""Static files through WhiteNoise, without making every other request cross threads.

WhiteNoise's middleware is sync-only. Under ASGI, Django runs a sync middleware in a worker thread and
the rest of the chain back on the event loop, for every request — a page, an API call, a token stream's
whole response — although WhiteNoise only ever answers addresses under ``STATIC_URL``. This one is
async-capable: it hands a request to WhiteNoise only when its address is under the static prefix (its
file opened in a thread, off the event loop) and passes every other request straight on.
"""
from __future__ import annotations

from asgiref.sync import sync_to_async
from django.http import HttpRequest, HttpResponse
from whitenoise.middleware import WhiteNoiseMiddleware

from webapp.core.middleware import DualModeMiddleware


class StaticFilesMiddleware(DualModeMiddleware):
    def __init__(self, get_response) -> None:
        super().__init__(get_response)
        self.whitenoise = WhiteNoiseMiddleware(get_response)
        # Files added from WHITENOISE_ROOT are served at the site's root: then every address may be one.
        self.static_only = all(url.startswith(self.whitenoise.static_prefix) for url in self.whitenoise.files)

    def call(self, request: HttpRequest) -> HttpResponse:
        return self.whitenoise(request)

    async def acall(self, request: HttpRequest) -> HttpResponse:
        whitenoise = self.whitenoise
        if self.static_only and not request.path_info.startswith(whitenoise.static_prefix):
            return await self.get_response(request)
        static_file = (await sync_to_async(whitenoise.find_file)(request.path_info) if whitenoise.autorefresh
                       else whitenoise.files.get(request.path_info))
        if static_file is None:
            return await self.get_response(request)
        return await sync_to_async(whitenoise.serve)(static_file, request)
