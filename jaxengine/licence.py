"""The base model's licence, carried into every export: Llama's, Gemma's and Apache-2.0's terms require a derivative
to pass on the licence files (and Llama's to say "Built with Llama"), which a folder of weights alone drops.

Design note. ``read_licence`` reads the facts from a model folder and nothing else (its README.md's front matter, the
names and sizes of its licence files), so the web app's base model page shows what an export will carry before a run
is launched, and a run started from another run's export reads them from that export, which carries them on.
``copy_licence_files`` puts the files into an export's staging folder before it is renamed into place (an export
never changes inside once renamed: ``checkpoint.hf.replace_directory``). jax-free: the web process imports it.
"""
from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import yaml

README_FILE = "README.md"
# A licence file past this is not copied (the card says so): licence texts are tens of KiB, and a file this large
# named LICENSE* is more likely data than terms.
LICENCE_FILE_MAX_BYTES = 1 << 20
# The front matter is at the top of README.md; a card's body (model-index tables, examples) need not be read.
_FRONT_MATTER_MAX_BYTES = 1 << 20
# The Hugging Face hub's ``license:`` ids of the Llama Community Licenses, whose section 1.b.i asks a derivative to
# display "Built with Llama".
LLAMA_LICENCES = frozenset({"llama2", "llama3", "llama3.1", "llama3.2", "llama3.3"})
BUILT_WITH_LLAMA = "Built with Llama"
_FRONT_MATTER_KEYS = ("license", "license_name", "license_link")
_LICENCE_PREFIXES = ("license", "licence", "notice", "use_policy", "copying")
_TERMS_WORD = re.compile(r"(?<![a-z])terms(?![a-z])")


def is_licence_file_name(name: str) -> bool:
    """Whether a file named ``name`` holds licence terms. Compared in lower case, with spaces and hyphens read as
    underscores: a name that starts with ``license``, ``licence``, ``notice``, ``use_policy`` or ``copying``
    (LICENSE, LICENSE.txt, LICENCE.md, NOTICE, USE_POLICY.md, COPYING), or that holds the word ``terms`` not inside
    another word (TERMS.md, "Gemma Terms of Use.txt", terms_of_use.md; not "determs"). Hidden files are not."""
    if name.startswith("."):
        return False
    normalized = re.sub(r"[ \-]", "_", name.lower())
    return normalized.startswith(_LICENCE_PREFIXES) or bool(_TERMS_WORD.search(normalized))


def split_front_matter(text: str) -> tuple[str | None, str]:
    """(the YAML between a README.md's opening ``---`` line and the next ``---`` or ``...`` line, the Markdown after
    it) of ``text``; ``(None, text)`` when it opens no front matter or never closes it. A byte-order mark and CRLF
    line ends are allowed (hub READMEs have both); the model cards Temper writes are read back the same way."""
    lines = text.lstrip("\ufeff").splitlines()
    if not lines or lines[0].rstrip() != "---":
        return None, text
    for number, line in enumerate(lines[1:], start=1):
        if line.rstrip() in ("---", "..."):
            return "\n".join(lines[1:number]), "\n".join(lines[number + 1:])
    return None, text


def front_matter_text(readme: Path) -> str | None:
    """``split_front_matter``'s YAML of the file ``readme``; None when it has none, it cannot be read, or the closing
    line is not within its first MiB."""
    try:
        with readme.open("rb") as file:
            head = file.read(_FRONT_MATTER_MAX_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return None
    return split_front_matter(head)[0]


def front_matter_licence(text: str | None) -> dict[str, str]:
    """``license``, ``license_name`` and ``license_link`` of a README.md's front matter ``text``, those that are
    non-empty strings, on one line each; {} for a front matter that is not YAML or not a mapping (a card's metadata
    is the model author's to get wrong: an export is not refused over it)."""
    try:
        meta = yaml.safe_load(text) if text else None
    except yaml.YAMLError:
        return {}
    if not isinstance(meta, dict):
        return {}
    return {key: " ".join(meta[key].split()) for key in _FRONT_MATTER_KEYS
            if isinstance(meta.get(key), str) and meta[key].strip()}


def read_licence(folder: str | Path) -> dict[str, Any]:
    """The licence facts of the model folder ``folder``: ``license``/``license_name``/``license_link`` from its
    README.md front matter (present keys only), ``files``: the names of its licence files (``is_licence_file_name``,
    regular files, links followed, sorted) of at most ``LICENCE_FILE_MAX_BYTES``, and ``not_copied``: those larger,
    as ``{"name", "bytes"}``. Reads no weights; a missing or unreadable folder has no facts."""
    folder = Path(folder)
    files, not_copied = [], []
    try:
        entries = sorted(os.scandir(folder), key=lambda entry: entry.name)
    except OSError:
        entries = []
    for entry in entries:
        if not is_licence_file_name(entry.name):
            continue
        try:
            if not entry.is_file():
                continue
            size = entry.stat().st_size
        except OSError:
            continue
        if size > LICENCE_FILE_MAX_BYTES:
            not_copied.append({"name": entry.name, "bytes": size})
        else:
            files.append(entry.name)
    return {**front_matter_licence(front_matter_text(folder / README_FILE)), "files": files,
            "not_copied": not_copied}


def states_a_licence(licence: dict[str, Any] | None) -> bool:
    """Whether ``read_licence``'s facts name a licence or found a licence file."""
    return bool(licence and (licence.get("license") or licence.get("license_name") or licence.get("license_link")
                             or licence.get("files") or licence.get("not_copied")))


def is_llama_licence(licence: dict[str, Any] | None) -> bool:
    """Whether the facts' ``license`` is one of the Llama Community Licenses (``LLAMA_LICENCES``)."""
    return bool(licence) and str(licence.get("license", "")).lower() in LLAMA_LICENCES


def copy_licence_files(source: str | Path, destination: str | Path, licence: dict[str, Any]) -> None:
    """Copy the licence files ``licence`` (``read_licence(source)``) lists from ``source`` into ``destination``,
    under the same names (a linked file's content, not the link)."""
    for name in licence.get("files") or ():
        shutil.copyfile(Path(source) / name, Path(destination) / name)
