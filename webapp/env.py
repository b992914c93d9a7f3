"""Typed helpers that read settings from the environment.

Every setting has an embedded default so that Temper runs with no variable set
(SQLite, a local data directory, a local Redis).
"""
from __future__ import annotations

import ipaddress
import os
from pathlib import Path


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_int(name: str, default: int | None, *, minimum: int | None = None, unit: str = "") -> int | None:
    """``name`` as an integer (``default`` when unset or empty); with ``minimum``, a smaller value is refused,
    the message naming the variable, the value, what it counts (``unit``: "seconds") and the least allowed."""
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError as exc:
        raise ValueError(f"environment variable {name}={raw!r} must be an integer") from exc
    if minimum is not None and value < minimum:
        raise ValueError(f"environment variable {name}={raw!r} is too small: give a whole number"
                         f"{f' of {unit}' if unit else ''}, at least {minimum}")
    return value


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    lowered = raw.strip().lower()
    if lowered in {"1", "true", "yes", "on"}:
        return True
    if lowered in {"0", "false", "no", "off"}:
        return False
    raise ValueError(f"environment variable {name}={raw!r} must be a boolean (1/0, true/false)")


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    if raw not in choices:
        raise ValueError(f"environment variable {name}={raw!r} must be one of {', '.join(choices)}")
    return raw


def env_path(name: str, default: Path) -> Path:
    raw = os.environ.get(name)
    return Path(raw).expanduser().resolve() if raw else default.resolve()


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_networks(name: str) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    """Comma-separated IP addresses or networks (``127.0.0.1, 10.0.0.0/8``); none when unset or empty."""
    networks = []
    for item in env_list(name, []):
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            raise ValueError(f"environment variable {name}: {item!r} is not an IP address or network (such as "
                             "10.0.0.5 or 10.0.0.0/8); separate several with commas") from None
    return tuple(networks)
