"""A real HTTP server in a thread that webhook deliveries are POSTed to (the unit tests', the API's and the browser
test's): it keeps every request and answers each with the next status of ``statuses`` (200 once they are used up).
``running_receiver`` is the fixture (``receiver``) that starts one, reachable by hooks."""
from __future__ import annotations

import hashlib
import hmac
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from ipaddress import ip_network

import pytest

# This host's network: webhooks reach only public addresses unless an administrator lists one (the receivers listen here).
LOOPBACK_ALLOWED = (ip_network("127.0.0.0/8"),)


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.body)


def verified(secret: str, received: Received) -> bool:
    """The README's recipe: the signature is HMAC-SHA256 of timestamp + "." + body with the hook's secret."""
    timestamp = received.headers["X-Temper-Timestamp"]
    expected = "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + received.body,
                                    hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, received.headers["X-Temper-Signature"])


@dataclass
class Receiver:
    statuses: list[int] = field(default_factory=list)
    requests: list[Received] = field(default_factory=list)
    redirect_to: str = ""
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def at(self, path: str) -> list[Received]:
        return [received for received in self.requests if received.path == path]

    def start(self) -> Receiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.requests.append(Received(path=self.path, headers=dict(self.headers), body=body))
                status = receiver.statuses.pop(0) if receiver.statuses else 200
                self.send_response(status)
                if 300 <= status < 400:
                    self.send_header("Location", receiver.redirect_to or receiver.url + "/elsewhere")
                answer = f"answer {status} " + "x" * 500  # longer than the 200 characters kept
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer.encode())

            def log_message(self, format, *args):  # quiet in the test output
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(name="receiver")
def running_receiver(settings):
    """``receiver``: a running ``Receiver`` that hooks may reach (``LOOPBACK_ALLOWED``), stopped after the test (import
    ``running_receiver`` into a test module or conftest to offer it there)."""
    settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS = LOOPBACK_ALLOWED
    server = Receiver().start()
    yield server
    server.stop()
