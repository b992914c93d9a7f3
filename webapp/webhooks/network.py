"""Where webhook messages may go: public addresses, and the networks an administrator lists.

Design note. Any project owner (anyone who makes a project) adds hooks, and the hook's page shows the start of each
answer, so without a guard an owner could make Temper's own host reach what only it can: the cloud metadata service
(169.254.169.254), services bound to loopback, the internal network. As GitLab and GitHub Enterprise do, messages go
only to public addresses unless ``TEMPER_WEBHOOK_ALLOWED_NETWORKS`` lists the network (an internal Mattermost's
``10.0.0.0/8``, a receiver on this host's ``127.0.0.1``).

The address is checked where the connection is made (``guarded_create_connection``, every address the name resolves
to), not only when the hook is saved: a name that resolved to a public address then and to an internal one now (DNS
rebinding) is still refused. HTTPS keeps verifying the certificate against the host name. Proxy variables
(``https_proxy``) are not used: a proxy would make the connection, out of the guard's sight.
"""
from __future__ import annotations

import http.client
import ipaddress
import socket
import urllib.request
from collections.abc import Iterable

from django.conf import settings

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefused(OSError):
    """The host resolves only to addresses webhooks may not reach; the message says which and what to do."""


def address_allowed(address: Address, allowed: Iterable[Network]) -> bool:
    """Whether a message may go to ``address``: a public (globally routable, not multicast) one, or one in
    ``allowed``. An IPv4 address written as IPv6 (``::ffff:127.0.0.1``) is judged as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if any(address in network for network in allowed if network.version == address.version):
        return True
    return address.is_global and not address.is_multicast


def _kind(address: Address) -> str:
    for name in ("loopback", "link_local", "private", "multicast", "unspecified", "reserved"):
        if getattr(address, f"is_{name}"):
            return name.replace("_", "-")
    return "non-public"


def refusal(host: str, addresses: list[Address]) -> str:
    """Why ``host`` is refused, naming its addresses and the setting that would allow them."""
    shown = ", ".join(f"{address} ({_kind(address)})" for address in addresses)
    return (f"{host} is at {shown}: webhooks go only to public addresses unless an administrator lists the network "
            "in TEMPER_WEBHOOK_ALLOWED_NETWORKS (e.g. 10.0.0.0/8 for an internal chat server)")


def _ip(sockaddr: tuple) -> Address:
    return ipaddress.ip_address(sockaddr[0].split("%", 1)[0])  # an IPv6 scope (fe80::1%eth0) is no part of it


def guarded_create_connection(address: tuple[str, int], timeout: float | None = None,
                              source_address: tuple[str, int] | None = None) -> socket.socket:
    """``socket.create_connection`` that connects only to allowed addresses of the host (tried in resolver order);
    ``AddressRefused`` when it has none."""
    host, port = address
    allowed = settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS
    refused: list[Address] = []
    last_error: OSError | None = None
    for family, kind, proto, _name, sockaddr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        ip = _ip(sockaddr)
        if not address_allowed(ip, allowed):
            refused.append(ip)
            continue
        sock = socket.socket(family, kind, proto)
        try:
            if timeout is not None:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as error:
            sock.close()
            last_error = error
    if last_error is not None:
        raise last_error
    raise AddressRefused(refusal(host, refused))


class _GuardedHTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = guarded_create_connection


class _GuardedHTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._create_connection = guarded_create_connection  # HTTPS then wraps the socket, checking the host name


class GuardedHTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req):
        return self.do_open(_GuardedHTTPConnection, req)


class GuardedHTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req):
        return self.do_open(_GuardedHTTPSConnection, req, context=self._context)


def literal_address_problem(host: str) -> str | None:
    """For an address written as an IP (checked when a hook is saved): why it is refused, None when allowed or when
    ``host`` is a name (names are judged when the message is sent, by what they resolve to then)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return None
    if address_allowed(address, settings.TEMPER_WEBHOOK_ALLOWED_NETWORKS):
        return None
    return refusal(host, [address])
