"""The base model's licence facts read from its folder (``jaxengine.licence.read_licence``): README.md's front matter
and the licence files an export carries on, on hand-made folders."""
from __future__ import annotations

import pytest

from jaxengine.licence import LICENCE_FILE_MAX_BYTES, copy_licence_files, is_licence_file_name, read_licence


def model_folder(path, readme: str | None = None, **files: str):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text("{}")
    (path / "model.safetensors").write_bytes(b"\0" * 16)
    if readme is not None:
        (path / "README.md").write_text(readme)
    for name, text in files.items():
        (path / name).write_text(text)
    return path


def test_it_reads_the_front_matters_licence_and_the_licence_files(tmp_path):
    folder = model_folder(tmp_path / "llama", "---\nlicense: llama3.2\nlicense_name: llama3.2\n"
                          "license_link: https://www.llama.com/llama3_2/license/\ntags: [text]\n---\n\n# Llama\n",
                          LICENSE="terms", **{"USE_POLICY.md": "policy"})
    assert read_licence(folder) == {"license": "llama3.2", "license_name": "llama3.2",
                                    "license_link": "https://www.llama.com/llama3_2/license/",
                                    "files": ["LICENSE", "USE_POLICY.md"], "not_copied": []}


@pytest.mark.parametrize("readme, expected", [
    ("---\nlicense: apache-2.0\n---\n", {"license": "apache-2.0"}),
    ("\ufeff---\r\nlicense: gemma\r\n...\r\nbody\n", {"license": "gemma"}),  # a BOM, CRLF and YAML's end marker
    ("---\nlicense: other\nlicense_name: |\n  my\n  licence\n---\n", {"license": "other", "license_name": "my licence"}),
    ("---\nlicense: [mit, apache-2.0]\nlicense_link: ''\n---\n", {}),  # not strings, or empty: left out
    ("# No front matter\nlicense: mit\n", {}),
    ("---\nlicense: mit\n", {}),  # never closed
    ("---\nlicense: [unclosed\n---\n", {}),  # not YAML
    ("---\n- a list\n---\n", {}),
    ("---\n---\n", {}),
])
def test_front_matter_variants(tmp_path, readme, expected):
    facts = read_licence(model_folder(tmp_path / "model", readme))
    assert {key: value for key, value in facts.items() if key not in ("files", "not_copied")} == expected


def test_a_folder_with_no_readme_or_a_missing_folder_has_no_facts(tmp_path):
    assert read_licence(model_folder(tmp_path / "bare")) == {"files": [], "not_copied": []}
    assert read_licence(tmp_path / "missing") == {"files": [], "not_copied": []}


@pytest.mark.parametrize("name, matched", [
    ("LICENSE", True), ("license.txt", True), ("LICENSE.md", True), ("Licence", True), ("LICENSE-APACHE", True),
    ("NOTICE", True), ("notice.txt", True), ("USE_POLICY.md", True), ("use-policy.md", True), ("COPYING", True),
    ("Gemma Terms of Use.txt", True), ("TERMS.md", True), ("terms_of_use.md", True), ("gemma-terms.txt", True),
    ("README.md", False), ("config.json", False), ("tokenizer.json", False), ("determs.txt", False),
    ("termsheet.txt", False), ("my_license.txt", False), (".LICENSE", False),
])
def test_licence_file_names(name, matched):
    assert is_licence_file_name(name) is matched


def test_only_files_are_listed_links_followed_and_a_big_one_is_not_copied(tmp_path):
    folder = model_folder(tmp_path / "model", "---\nlicense: apache-2.0\n---\n", **{"NOTICE": "notice"})
    (folder / "LICENSE").mkdir()  # a directory of that name is not a licence file
    (tmp_path / "blob").write_text("apache terms")
    (folder / "LICENSE.txt").symlink_to(tmp_path / "blob")  # as a Hugging Face cache snapshot links its files
    (folder / "COPYING").write_bytes(b"x" * (LICENCE_FILE_MAX_BYTES + 1))
    (folder / "TERMS.md").write_bytes(b"x" * LICENCE_FILE_MAX_BYTES)  # at the limit: copied
    facts = read_licence(folder)
    assert facts["files"] == ["LICENSE.txt", "NOTICE", "TERMS.md"]
    assert facts["not_copied"] == [{"name": "COPYING", "bytes": LICENCE_FILE_MAX_BYTES + 1}]
    export = tmp_path / "export"
    export.mkdir()
    copy_licence_files(folder, export, facts)
    assert sorted(path.name for path in export.iterdir()) == ["LICENSE.txt", "NOTICE", "TERMS.md"]
    assert (export / "LICENSE.txt").read_text() == "apache terms" and not (export / "LICENSE.txt").is_symlink()
