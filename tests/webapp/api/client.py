"""A plain HTTP client (urllib) of the REST API, as a script would use it: the API tests' only way in."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid


class Api:
    def __init__(self, base: str, token: str | None):
        self.base, self.token = base, token

    def call(self, method: str, path: str, body: dict | None = None, *, data: bytes | None = None,
             content_type: str = "application/json", headers: dict[str, str] | None = None) -> tuple[int, object]:
        if body is not None:
            data = json.dumps(body).encode()
        request = urllib.request.Request(self.base + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", content_type)
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                raw, status, kind = response.read(), response.status, response.headers.get("Content-Type", "")
        except urllib.error.HTTPError as error:
            raw, status, kind = error.read(), error.code, error.headers.get("Content-Type", "")
        return status, json.loads(raw) if kind.startswith("application/json") else raw

    def upload(self, path: str, fields: dict[str, str], filename: str, content: bytes) -> tuple[int, object]:
        boundary = uuid.uuid4().hex
        parts = [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n\r\n{value}\r\n'.encode()
                 for name, value in fields.items()]
        parts.append(f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="{filename}"\r\n'
                     f"Content-Type: application/octet-stream\r\n\r\n".encode() + content + b"\r\n")
        parts.append(f"--{boundary}--\r\n".encode())
        return self.call("POST", path, data=b"".join(parts), content_type=f"multipart/form-data; boundary={boundary}")
