"""Base models uploaded as an archive (``webapp.basemodels.uploads``): real zip and tar files of a tiny model,
unpacked into the project's own folder and registered in one step, or refused with nothing left behind."""
import gzip
import io
import json
import os
import stat
import subprocess
import time
import tarfile
import zipfile
from contextlib import contextmanager
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.template.defaultfilters import filesizeformat

from tests.webapp.factories import TINY_LLAMA_PARAMETERS, make_team, write_model_dir
from webapp.basemodels.models import BaseModel
from webapp.basemodels.selectors import candidate_model_dirs
from webapp.basemodels.services import basemodel_register
from webapp.basemodels.uploads import basemodel_upload


@pytest.fixture
def model_files(tmp_path) -> Path:
    return write_model_dir(tmp_path / "source" / "tiny")


def zip_of(path: Path, model_dir: Path, *, prefix: str = "") -> Path:
    with zipfile.ZipFile(path, "w") as packed:
        for file in sorted(model_dir.iterdir()):
            packed.write(file, prefix + file.name)
    return path


def tar_of(path: Path, model_dir: Path, *, prefix: str = "") -> Path:
    with tarfile.open(path, "w:gz" if path.name.endswith(".gz") else "w") as packed:
        for file in sorted(model_dir.iterdir()):
            packed.add(file, prefix + file.name)
    return path


def refusal(project, archive: Path, *, name: str = "uploaded", field: str = "archive", **options) -> str:
    with pytest.raises(ValidationError) as excinfo:
        basemodel_upload(project=project, name=name, archive=archive, archive_name=archive.name, user=None, **options)
    [message] = excinfo.value.message_dict[field]
    return message


def left_in(root: Path) -> list[str]:
    """Every path under the models root, relative to it."""
    return sorted(str(path.relative_to(root)) for path in root.rglob("*"))


@pytest.mark.parametrize("archive_name,prefix", [
    ("tiny.zip", ""), ("tiny.tar", ""), ("tiny.tar.gz", ""), ("tiny.tgz", "tiny/"), ("tiny.zip", "tiny/"),
    ("tiny.tar.gz", "./")])  # tar -C my-model -czf tiny.tar.gz .
def test_it_unpacks_into_the_projects_folder_and_registers_it(team, models_root, model_files, tmp_path,
                                                              archive_name, prefix):
    packer = zip_of if archive_name.endswith(".zip") else tar_of
    archive = packer(tmp_path / archive_name, model_files, prefix=prefix)
    model = basemodel_upload(project=team.project, name="uploaded", archive=archive, archive_name=archive_name,
                             user=team.owner)
    folder = models_root.resolve() / "projects" / "alpha" / "uploaded"
    assert model.path == str(folder) and model.registered_by == team.owner
    assert model.architecture == "LlamaForCausalLM" and model.parameter_count == TINY_LLAMA_PARAMETERS
    assert sorted(path.name for path in folder.iterdir()) == sorted(path.name for path in model_files.iterdir())
    assert (folder / "config.json").read_bytes() == (model_files / "config.json").read_bytes()
    assert left_in(models_root) == ["projects", "projects/alpha", "projects/alpha/uploaded",
                                    *sorted(f"projects/alpha/uploaded/{path.name}" for path in model_files.iterdir())]


def refused_and_nothing_left(project, archive: Path, models_root: Path, **options) -> str:
    message = refusal(project, archive, **options)
    assert left_in(models_root) in ([], ["projects"], ["projects", "projects/alpha"]), "no folder, not even hidden"
    assert not BaseModel.objects.filter(project=project).exists()
    return message


@pytest.mark.parametrize("member", ["../escaped.txt", "/tmp/escaped.txt", "config/../../escaped.txt",
                                    "..\\escaped.txt"])
@pytest.mark.parametrize("suffix", [".zip", ".tar"])
def test_it_rejects_a_member_that_leaves_the_folder(team, models_root, model_files, tmp_path, member, suffix):
    archive = tmp_path / f"slip{suffix}"
    if suffix == ".zip":
        zip_of(archive, model_files)
        with zipfile.ZipFile(archive, "a") as packed:
            packed.writestr(zipfile.ZipInfo(member), b"x")
    else:
        with tarfile.open(archive, "w") as packed:
            for file in sorted(model_files.iterdir()):
                packed.add(file, file.name)
            info = tarfile.TarInfo(member)
            info.size = 1
            packed.addfile(info, io.BytesIO(b"x"))
    message = refused_and_nothing_left(team.project, archive, models_root)
    assert message == (f"{archive.name}: the member {member!r} would be written outside the model's folder (an "
                       "absolute path or '..'); pack the model directory with paths relative to it")
    assert not (tmp_path / "escaped.txt").exists() and not Path("/tmp/escaped.txt").exists()


def tar_with(archive: Path, model_files: Path, info: tarfile.TarInfo) -> Path:
    with tarfile.open(archive, "w") as packed:
        for file in sorted(model_files.iterdir()):
            packed.add(file, file.name)
        packed.addfile(info)
    return archive


@pytest.mark.parametrize("kind,member_type", [("symbolic link", tarfile.SYMTYPE), ("hard link", tarfile.LNKTYPE),
                                              ("device", tarfile.CHRTYPE), ("device", tarfile.BLKTYPE),
                                              ("pipe", tarfile.FIFOTYPE)])
def test_it_rejects_links_and_devices_in_a_tar(team, models_root, model_files, tmp_path, kind, member_type):
    info = tarfile.TarInfo("tokenizer_config.json")
    info.type, info.linkname = member_type, "/etc/passwd"
    archive = tar_with(tmp_path / "special.tar", model_files, info)
    assert refused_and_nothing_left(team.project, archive, models_root) == (
        f"special.tar: the member 'tokenizer_config.json' is a {kind}; a model archive holds plain files and folders "
        "only: pack the files the links point to instead (tar -h, zip without -y)")


def test_it_rejects_a_symbolic_link_in_a_zip(team, models_root, model_files, tmp_path):
    archive = zip_of(tmp_path / "link.zip", model_files)
    info = zipfile.ZipInfo("tokenizer_config.json")
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    with zipfile.ZipFile(archive, "a") as packed:
        packed.writestr(info, "/etc/passwd")
    assert "the member 'tokenizer_config.json' is a symbolic link" in refused_and_nothing_left(
        team.project, archive, models_root)


@pytest.mark.parametrize("archive_name", ["big.zip", "big.tar.gz"])
def test_it_rejects_an_archive_whose_declared_sizes_pass_the_limit(team, models_root, model_files, tmp_path,
                                                                   archive_name):
    packer = zip_of if archive_name.endswith(".zip") else tar_of
    archive = packer(tmp_path / archive_name, model_files)
    limit = sum(file.stat().st_size for file in model_files.iterdir()) - 1
    assert refused_and_nothing_left(team.project, archive, models_root, max_bytes=limit) == (
        f"{archive_name}: its members' sizes add up to more than {filesizeformat(limit)} ({limit} bytes, "
        "TEMPER_MODEL_UPLOAD_MAX_BYTES); upload a smaller model, or ask an administrator to copy it under the models "
        "root")


@pytest.mark.parametrize("archive_name", ["many.zip", "many.tar", "many.tar.gz"])
def test_it_rejects_an_archive_of_more_members_than_the_limit(team, models_root, model_files, tmp_path, settings,
                                                             archive_name):
    """Millions of tiny members would use up the disk's inodes long before its bytes: the count is bounded
    (TEMPER_MODEL_UPLOAD_MAX_MEMBERS), a zip's before anything is written, a tar's as it streams."""
    settings.TEMPER_MODEL_UPLOAD_MAX_MEMBERS = 6
    for index in range(5):
        (model_files / f"extra-{index}.txt").write_text("x")
    packer = zip_of if archive_name.endswith(".zip") else tar_of
    archive = packer(tmp_path / archive_name, model_files)
    members = len(list(model_files.iterdir()))
    assert members > 6
    assert refused_and_nothing_left(team.project, archive, models_root) == (
        f"{archive_name}: it holds more than 6 files and folders (TEMPER_MODEL_UPLOAD_MAX_MEMBERS); a model directory "
        "holds a few dozen: pack the model directory alone, or ask an administrator to copy it under the models root")


def test_an_archive_of_as_many_members_as_the_limit_is_taken(team, models_root, model_files, tmp_path, settings):
    settings.TEMPER_MODEL_UPLOAD_MAX_MEMBERS = len(list(model_files.iterdir()))
    for packer, name in ((zip_of, "exact.zip"), (tar_of, "exact.tar")):
        archive = packer(tmp_path / name, model_files)
        model = basemodel_upload(project=team.project, name=name.replace(".", "-"), archive=archive,
                                 archive_name=name, user=None)
        assert len(list(Path(model.path).iterdir())) == settings.TEMPER_MODEL_UPLOAD_MAX_MEMBERS


def test_a_zip_that_understates_its_sizes_is_refused_without_inflating_past_them(team, models_root, tmp_path):
    """A zip bomb: the central directory says a member is 10 bytes, its compressed data inflates to a megabyte.
    Nothing past the declared 10 bytes is inflated (zipfile stops there, and the checksum then fails); what is
    written is counted against the limit besides."""
    archive = tmp_path / "bomb.zip"
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_DEFLATED) as packed:
        packed.writestr("padding.bin", b"\0" * 1_000_000)
    data = bytearray(archive.read_bytes())
    # The uncompressed size in the central directory's entry (at its offset 24) and in the local header (22).
    central = data.rindex(b"PK\x01\x02")
    data[central + 24:central + 28] = (10).to_bytes(4, "little")
    data[22:26] = (10).to_bytes(4, "little")
    archive.write_bytes(bytes(data))
    assert refused_and_nothing_left(team.project, archive, models_root, max_bytes=500_000) == (
        "bomb.zip: not a readable zip archive (Bad CRC-32 for file 'padding.bin'); pack it again")


def test_it_rejects_an_archive_without_config_json(team, models_root, model_files, tmp_path):
    (model_files / "config.json").unlink()
    archive = tar_of(tmp_path / "noconfig.tar", model_files)
    assert refused_and_nothing_left(team.project, archive, models_root) == (
        "noconfig.tar: no config.json; is this a Hugging Face-format model directory?")


def test_it_rejects_a_corrupt_safetensors_header_as_the_register_form_does(team, models_root, model_files, tmp_path):
    (model_files / "model.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    archive = zip_of(tmp_path / "corrupt.zip", model_files)
    message = refused_and_nothing_left(team.project, archive, models_root)
    registered_dir = write_model_dir(models_root / "shared" / "same")
    (registered_dir / "model.safetensors").write_bytes((10**9).to_bytes(8, "little") + b"{}")
    with pytest.raises(ValidationError) as excinfo:
        basemodel_register(project=team.project, name="same", path="shared/same", user=None)
    [register_message] = excinfo.value.message_dict["path"]
    assert message == register_message.replace(str(registered_dir.resolve()), "corrupt.zip")


def test_it_rejects_a_file_that_is_no_archive(team, models_root, model_files, tmp_path):
    not_zip = tmp_path / "weights.zip"
    not_zip.write_bytes(b"not a zip at all")
    assert refused_and_nothing_left(team.project, not_zip, models_root).startswith(
        "weights.zip: not a readable zip archive (")
    plain = tmp_path / "model.safetensors"
    plain.write_bytes(b"{}")
    assert refused_and_nothing_left(team.project, plain, models_root) == (
        "model.safetensors: not a .zip, .tar or .tar.gz file; pack the model directory as one")


def test_it_rejects_a_name_taken_by_a_base_model(team, models_root, model_files, tmp_path):
    write_model_dir(models_root / "shared" / "other")
    basemodel_register(project=team.project, name="Uploaded", path="shared/other", user=None)
    archive = zip_of(tmp_path / "tiny.zip", model_files)
    assert refusal(team.project, archive, field="name") == (
        "alpha already has a base model named 'Uploaded'; names that differ only in letter case are the same name")
    assert not (models_root / "projects").exists()
    assert BaseModel.objects.filter(project=team.project).count() == 1


def test_it_rejects_a_name_taken_by_a_folder_and_leaves_that_folder_alone(team, models_root, model_files, tmp_path):
    existing = models_root / "projects" / "alpha" / "uploaded"
    existing.mkdir(parents=True)
    (existing / "notes.txt").write_text("theirs")
    archive = zip_of(tmp_path / "tiny.zip", model_files)
    assert refusal(team.project, archive, field="name") == (
        f"{existing.resolve()} already exists: choose another name (or register that directory on the Register page, "
        "if it is the model)")
    assert left_in(models_root) == ["projects", "projects/alpha", "projects/alpha/uploaded",
                                    "projects/alpha/uploaded/notes.txt"]
    assert not BaseModel.objects.exists()


def test_an_empty_folder_made_under_the_name_while_it_unpacks_is_left_alone(team, models_root, model_files, tmp_path,
                                                                           monkeypatch):
    """os.rename replaces an empty folder on Linux: one made under the model's name while the archive unpacked (by
    an administrator, another tool) was silently replaced. The folder is made at the last moment before the rename,
    once the unpacked model is checked; the real unpacking and the real rename run."""
    from webapp.basemodels import uploads

    target = models_root.resolve() / "projects" / "alpha" / "uploaded"
    check = uploads.read_model_facts

    def checked_then_taken(*args, **kwargs):
        facts = check(*args, **kwargs)
        target.mkdir()
        return facts

    monkeypatch.setattr(uploads, "read_model_facts", checked_then_taken)
    archive = zip_of(tmp_path / "tiny.zip", model_files)
    assert refusal(team.project, archive, field="name") == (
        f"{target} already exists: choose another name (or register that directory on the Register page, if it is the "
        "model)")
    assert left_in(models_root) == ["projects", "projects/alpha", "projects/alpha/uploaded"]
    assert not BaseModel.objects.exists()


@pytest.mark.parametrize("renameat2", ["kernel", "missing"])
def test_rename_without_replacing_refuses_an_empty_folder(tmp_path, monkeypatch, renameat2):
    """RENAME_NOREPLACE where the C library has renameat2; otherwise the name is claimed with mkdir first (it fails
    on anything there) and only that claimed, empty folder is replaced."""
    from webapp.basemodels import uploads

    if renameat2 == "missing":
        monkeypatch.setattr(uploads, "_RENAMEAT2", None)
    source, target = tmp_path / "unpacked", tmp_path / "model"
    source.mkdir()
    (source / "config.json").write_text("{}")
    target.mkdir()
    with pytest.raises(FileExistsError):
        uploads.rename_without_replacing(source, target)
    assert list(target.iterdir()) == [] and (source / "config.json").read_text() == "{}"
    target.rmdir()
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError):
        uploads.rename_without_replacing(source, tmp_path / "dangling")
    uploads.rename_without_replacing(source, target)
    assert (target / "config.json").read_text() == "{}" and not source.exists()


@pytest.mark.parametrize("name", ["../up", ".hidden", "a/b", "two words"])
def test_it_rejects_a_name_that_is_no_folder_name(team, models_root, model_files, tmp_path, name):
    archive = zip_of(tmp_path / "tiny.zip", model_files)
    assert "is also the model's folder name" in refusal(team.project, archive, name=name, field="name")
    assert left_in(models_root) == []


@contextmanager
def read_only(folder: Path):
    """``folder`` read-only for this process: a read-only file system mounted on it for root (whom no mode bit
    stops), its mode bits for anyone else."""
    if os.geteuid() == 0:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)], check=True)
        try:
            yield
        finally:
            subprocess.run(["umount", str(folder)], check=True)
    else:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)


def test_it_rejects_a_read_only_root_naming_it(team, models_root, model_files, tmp_path):
    archive = zip_of(tmp_path / "tiny.zip", model_files)
    with read_only(models_root):
        message = refusal(team.project, archive)
        assert left_in(models_root) == []
    folder = models_root.resolve() / "projects" / "alpha"
    assert message.startswith(f"cannot write to {folder} (")
    assert message.endswith("): the models root is read-only for Temper. Ask an administrator to make that folder "
                            "writable by the user the web server runs as, or to copy the model there and register it "
                            "on the Register page")
    assert not BaseModel.objects.exists()


def test_another_project_uploading_the_same_name_gets_its_own_folder(team, models_root, model_files, tmp_path):
    other = make_team(slug="beta")
    archive = zip_of(tmp_path / "tiny.zip", model_files)
    for project in (team.project, other.project):
        basemodel_upload(project=project, name="uploaded", archive=archive, archive_name="tiny.zip", user=None)
    assert {model.path for model in BaseModel.objects.all()} == {
        str(models_root.resolve() / "projects" / slug / "uploaded") for slug in ("alpha", "beta")}


def test_a_folder_still_being_unpacked_is_neither_offered_nor_registered(team, models_root):
    """Half-written until it is renamed: registered meanwhile, its row would name a folder about to be gone."""
    write_model_dir(models_root / "projects" / "alpha" / ".upload-abc123")
    write_model_dir(models_root / "projects" / "alpha" / ".upload-def456" / "tiny")
    assert candidate_model_dirs(models_root=models_root, project_slug="alpha") == []
    for path in ("projects/alpha/.upload-abc123", "projects/alpha/.upload-def456/tiny"):
        with pytest.raises(ValidationError) as excinfo:
            basemodel_register(project=team.project, name="early", path=path, user=None)
        assert excinfo.value.message_dict["path"] == [
            f"{models_root.resolve() / path} is an uploaded archive still being unpacked; when it is done it is "
            "registered under the name it was uploaded with"]
    assert not BaseModel.objects.exists()


@pytest.mark.parametrize("member,problem", [
    ("x" * 300 + ".json", "could not be written (File name too long); if the archive is sound (names of at most 255 "
                          "bytes), ask an administrator whether the models root's disk has room"),
    ("config.json/inside.txt", "needs a folder where the archive has a file of that name; pack it again")])
def test_it_names_a_member_it_cannot_write(team, models_root, model_files, tmp_path, member, problem):
    """An OSError while unpacking was told as a full disk, naming no member."""
    archive = zip_of(tmp_path / "odd.zip", model_files)
    with zipfile.ZipFile(archive, "a") as packed:
        packed.writestr(member, b"x")
    assert refused_and_nothing_left(team.project, archive, models_root) == f"odd.zip: the member {member!r} {problem}"


def test_it_rejects_a_corrupt_gzip_stream(team, models_root, model_files, tmp_path):
    archive = tar_of(tmp_path / "cut.tar.gz", model_files)
    # Garbled where the compressed data starts (after gzip's 10-byte header): garbled at the end, deflate may decode
    # it into wrong bytes with no error, and the tar stream reader never checks gzip's CRC.
    packed = archive.read_bytes()
    archive.write_bytes(packed[:10] + b"\xff" * 200 + packed[210:])
    assert refused_and_nothing_left(team.project, archive, models_root).startswith(
        "cut.tar.gz: not a readable tar.gz archive (")


def test_it_rejects_a_tar_gz_whose_gzip_checksum_does_not_match_its_bytes(team, models_root, model_files, tmp_path):
    """Damage late in a .tar.gz can inflate into wrong bytes with no deflate error, and tarfile's stream reader
    never checks gzip's CRC: the damaged weights were unpacked and registered. A wrong CRC in the trailer stands for
    any such damage: the bytes unpacked are not the bytes packed."""
    archive = tar_of(tmp_path / "late.tar.gz", model_files)
    packed = bytearray(archive.read_bytes())
    packed[-8:-4] = bytes(byte ^ 0xFF for byte in packed[-8:-4])  # the trailer's CRC32 of the uncompressed bytes
    archive.write_bytes(bytes(packed))
    assert refused_and_nothing_left(team.project, archive, models_root) == (
        "late.tar.gz: not a readable tar.gz archive (CRC check failed 0x%x != 0x%x); pack it again"
        % (int.from_bytes(packed[-8:-4], "little"), int.from_bytes(packed[-8:-4], "little") ^ 0xFFFFFFFF))


def test_an_upload_removes_the_folders_of_uploads_killed_while_they_unpacked(team, models_root, model_files,
                                                                             tmp_path):
    """A process killed mid-unpack (a restart, the memory killer) cannot clean up: its hidden folder stayed."""
    folder = models_root / "projects" / "alpha"
    abandoned, recent = write_model_dir(folder / ".upload-old"), write_model_dir(folder / ".upload-new")
    day_ago = time.time() - 25 * 3600
    os.utime(abandoned, (day_ago, day_ago))
    basemodel_upload(project=team.project, name="uploaded", archive=zip_of(tmp_path / "tiny.zip", model_files),
                     archive_name="tiny.zip", user=None)
    assert not abandoned.exists()
    assert recent.exists(), "an upload still unpacking is left alone"


def test_a_folder_zipped_by_macos_is_found_beside_its_metadata(team, models_root, model_files, tmp_path):
    """macOS's Compress packs the folder under its own name and adds __MACOSX/ with ._ files beside it."""
    archive = zip_of(tmp_path / "tiny.zip", model_files, prefix="tiny/")
    with zipfile.ZipFile(archive, "a") as packed:
        packed.writestr("__MACOSX/tiny/._config.json", b"\0\5\26\7")
    model = basemodel_upload(project=team.project, name="mac", archive=archive, archive_name="tiny.zip", user=None)
    assert sorted(path.name for path in Path(model.path).iterdir()) == sorted(path.name for path in model_files.iterdir())
    assert left_in(models_root / "projects" / "alpha") == sorted(
        ["mac", *(f"mac/{path.name}" for path in model_files.iterdir())])


def _with_safetensors_header(model_dir: Path, edit) -> None:
    """Rewrite ``model_dir``'s model.safetensors with its header's JSON text passed through ``edit``."""
    weights = model_dir / "model.safetensors"
    raw = weights.read_bytes()
    header_bytes = int.from_bytes(raw[:8], "little")
    header = edit(raw[8:8 + header_bytes].decode().rstrip()).encode()  # its padding off
    weights.write_bytes(len(header).to_bytes(8, "little") + header + raw[8 + header_bytes:])


def _with_config_field(model_dir: Path, raw_value: str) -> None:
    config = (model_dir / "config.json").read_text()
    (model_dir / "config.json").write_text(config[:-1] + ', "extra": ' + raw_value + "}")


TOO_MANY_DIGITS = "1" * 5000  # past Python's 4,300-digit limit on converting a decimal string to an int
NESTED = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize("damage, said", [
    (lambda model_dir: _with_config_field(model_dir, TOO_MANY_DIGITS),
     "tiny.zip/config.json: not valid JSON (a number of over 4,300 digits, more than any field takes)"),
    (lambda model_dir: _with_safetensors_header(model_dir, lambda text: text[:-1] + ', "extra": ' + TOO_MANY_DIGITS
                                                + "}"),
     "tiny.zip/model.safetensors: header is not valid JSON (a number of over 4,300 digits, more than any field "
     "takes); the file is corrupt"),
    (lambda model_dir: _with_safetensors_header(model_dir, lambda text: text[:-1] + ', "extra": ' + NESTED + "}"),
     "tiny.zip/model.safetensors: header is not valid JSON (it nests too deeply to be read); the file is corrupt"),
    (lambda model_dir: _with_safetensors_header(model_dir, lambda text: text[:-1] + ', "model.layers.'
                                                + TOO_MANY_DIGITS + '.mlp.up_proj.weight": {"dtype": "F32", '
                                                '"shape": [0], "data_offsets": [0, 0]}}'),
     "tiny.zip/model.safetensors: the tensor 'model.layers.111111…' is named for layer 111111… (5000 digits), "
     "more layers than any model has; the file is corrupt"),
], ids=["config-number-of-5000-digits", "header-number-of-5000-digits", "header-nested-100000-deep",
        "layer-index-of-5000-digits"])
def test_it_rejects_json_python_cannot_read_naming_the_file(team, models_root, model_files, tmp_path, damage, said):
    """Security review: a number past Python's digit limit in config.json or a safetensors header (a ValueError, not
    a JSONDecodeError), a header nested past the recursion limit, and a tensor named for layer 10**5000 (int() of
    its index) were 500s; each is the archive's refusal naming the file, with nothing left behind."""
    damage(model_files)
    message = refused_and_nothing_left(team.project, zip_of(tmp_path / "tiny.zip", model_files), models_root)
    assert message.startswith(said), message
    assert str(models_root) not in message


@pytest.mark.parametrize("file_name", ["tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                                       "chat_template_kwargs.json"])
@pytest.mark.parametrize("value, said", [(TOO_MANY_DIGITS, "a number of over 4,300 digits, more than any field takes"),
                                         (NESTED, "it nests too deeply to be read")],
                         ids=["number-of-5000-digits", "nested-100000-deep"])
def test_tokenizer_files_python_cannot_read_are_said_as_their_load_errors(team, models_root, model_files, tmp_path,
                                                                          file_name, value, said):
    """Security review: the tokenizer's JSON files, read at registration through ``jaxengine.json_files``
    (``read_json_object``), were a 500 for such JSON (a ValueError or RecursionError, not a JSONDecodeError). Now
    they are what any unreadable tokenizer is: the model is registered (its runs say why they cannot load it, as
    for a syntax error) and the tokenizer's load names the file."""
    from jaxengine.tokenizer import TokenizerError, load_tokenizer

    (model_files / file_name).write_text('{"extra": ' + value + "}")
    model = basemodel_upload(project=team.project, name="uploaded", archive=zip_of(tmp_path / "tiny.zip", model_files),
                             archive_name="tiny.zip", user=None)
    with pytest.raises(TokenizerError) as excinfo:
        load_tokenizer(model.path)
    assert str(excinfo.value) == f"{model.path}/{file_name}: not valid JSON ({said}); fix or remove the file"


def test_a_tar_gz_inflating_past_the_limit_after_the_tars_end_is_refused(team, models_root, model_files, tmp_path):
    """Security review: the gzip stream is drained after the tar's end (to check its CRC), and that drain counted
    nothing: zeros packed after the tar, 1000:1 in deflate, had an owner's 20 GB archive inflate for hours in the web
    request. Past the limit, the drain stops with the refusal."""
    tar = tar_of(tmp_path / "tiny.tar", model_files).read_bytes()
    archive = tmp_path / "padded.tar.gz"
    with gzip.open(archive, "wb") as packed:
        packed.write(tar)
        for _ in range(64):
            packed.write(bytes(1024 * 1024))
    assert archive.stat().st_size < 1024 * 1024
    assert refused_and_nothing_left(team.project, archive, models_root, max_bytes=1024 * 1024) == (
        "padded.tar.gz: its gzip stream goes on past the tar's end for more than 1.0\xa0MB (1048576 bytes, "
        "TEMPER_MODEL_UPLOAD_MAX_BYTES); pack the model directory again (tar -czf)")


@pytest.mark.parametrize("header_type", [tarfile.XHDTYPE, tarfile.GNUTYPE_LONGNAME], ids=["pax", "gnu-long-name"])
def test_a_tar_whose_extended_header_is_larger_than_any_name_is_refused_before_it_is_read(
        team, models_root, model_files, tmp_path, header_type):
    """Security review: tarfile reads a pax header or a GNU long name whole into memory, of the size its tar header
    declares, before the member it describes is seen (or counted toward the limit): 20 GB of zeros there, a 20 MB
    .tar.gz, was 20 GB of the web process's memory. One past 1 MiB (a name is at most a few KB) is refused unread."""
    archive = tmp_path / "header.tar.gz"
    with gzip.open(archive, "wb") as packed:
        header = tarfile.TarInfo("././@LongLink" if header_type == tarfile.GNUTYPE_LONGNAME else "PaxHeaders/x")
        header.type, header.size = header_type, 64 * 1024 * 1024
        packed.write(header.tobuf(format=tarfile.GNU_FORMAT))
        for _ in range(64):
            packed.write(bytes(1024 * 1024))
        packed.write(tar_of(tmp_path / "tiny.tar", model_files).read_bytes())
    message = refused_and_nothing_left(team.project, archive, models_root)
    assert message == (f"header.tar.gz: not a readable tar.gz archive (the member {header.name!r} is an extended "
                       "header (a long name or pax attributes) of 67,108,864 bytes, past the 1,048,576 a tar packs "
                       "for a name); pack it again"), message


def test_a_zip_whose_central_directory_is_larger_than_its_members_need_is_refused_before_it_is_read(
        team, models_root, model_files, tmp_path, settings):
    """Security review: zipfile reads a zip's central directory whole into memory (and makes an object of each
    entry) before its members can be counted: a 20 GB archive that is all central directory (entries with 64 KB
    comments) was 20 GB of the web process's memory. Past 4 KiB an entry for TEMPER_MODEL_UPLOAD_MAX_MEMBERS
    entries (a model's entry takes a few hundred bytes), it is refused unread."""
    settings.TEMPER_MODEL_UPLOAD_MAX_MEMBERS = 10
    archive = tmp_path / "comments.zip"
    with zipfile.ZipFile(archive, "w") as packed:
        for file in sorted(model_files.iterdir()):
            info = zipfile.ZipInfo(file.name)
            info.comment = b"c" * 65_535
            packed.writestr(info, file.read_bytes())
    with zipfile.ZipFile(archive) as packed:
        central_bytes = sum(46 + len(info.filename) + len(info.extra) + len(info.comment) for info in packed.infolist())
    message = refused_and_nothing_left(team.project, archive, models_root)
    assert message == (f"comments.zip: its central directory (the list of members) is {central_bytes:,} bytes, more "
                       "than 10 members take (40,960 bytes, 4 KiB a member, TEMPER_MODEL_UPLOAD_MAX_MEMBERS); pack "
                       "the model directory alone"), message


def test_a_zip_whose_end_record_points_past_the_archive_is_refused_as_damaged(team, models_root, model_files, tmp_path):
    """An end record declaring a central directory larger than the archive (a zip cut short before its directory,
    damaged) was told its directory held too many members, and to pack the model directory alone."""
    archive = zip_of(tmp_path / "damaged.zip", model_files)
    data = bytearray(archive.read_bytes())
    data[-22 + 12:-22 + 16] = (0xFFFF_FFFE).to_bytes(4, "little")  # the end record's directory size
    archive.write_bytes(bytes(data))
    message = refused_and_nothing_left(team.project, archive, models_root)
    assert message == (f"damaged.zip: not a readable zip archive (its end record declares a central directory of "
                       f"4,294,967,294 bytes, ending at byte {len(data) - 22:,}: more than the archive holds before it "
                       "(cut short, or damaged)); pack it again"), message


@pytest.mark.parametrize("field, raw_value, said", [
    ("rope_theta", "1" + "0" * 4000, "an integer of 4001 digits"),
    ("rms_norm_eps", "-1" + "0" * 400, "an integer of 401 digits"),
    ("rope_scaling", '{"rope_type": "linear", "factor": 1' + "0" * 400 + "}", "an integer of 401 digits"),
    ("rope_theta", "1e999", "inf"),
    ("rope_theta", "NaN", "nan"),
], ids=["int-of-4001-digits", "negative-int-of-401-digits", "nested-int", "float-past-the-largest", "nan"])
def test_it_rejects_a_config_number_no_model_holds_naming_the_field(team, models_root, model_files, tmp_path, field,
                                                                    raw_value, said):
    """Security review: an integer past a float's range where the config reader wants a float (rope_theta,
    rms_norm_eps, a rope scaling factor) was an OverflowError, and 1e999 or NaN (JSON as Python reads it) an
    IntegrityError storing the config (JSON has no infinity): 500s. A number past a float's range or not finite is
    refused naming its field (one within a float's range is left to its field's own check)."""
    config = json.loads((model_files / "config.json").read_text())
    config.pop(field, None)
    (model_files / "config.json").write_text(json.dumps(config)[:-1] + f', "{field}": {raw_value}}}')
    message = refused_and_nothing_left(team.project, zip_of(tmp_path / "tiny.zip", model_files), models_root)
    shown = f"{field}.factor" if field == "rope_scaling" else field
    assert message == (f"tiny.zip/config.json: field {shown!r} is {said}, past the range of the numbers a config holds "
                       "(a float's, finite); fix the field"), message


@pytest.mark.parametrize("raw_field, shown, said", [
    ('"note": "caf\\udce9"', "note", "a lone \\udce9 escape"),
    ('"rope_scaling": {"\\ud800": 1}', "rope_scaling.\ud800", "a lone \\ud800 escape"),
], ids=["value", "key"])
def test_it_rejects_a_config_text_with_a_lone_surrogate_naming_the_field(team, models_root, model_files, tmp_path,
                                                                         client_for, raw_field, shown, said):
    """Security review: JSON's escape of half a UTF-16 pair ("\\udce9") reads into a str that cannot be encoded: the
    model was registered, and its page, which shows config.json, was a 500 at every visit (on PostgreSQL the config
    could not be stored). Such text is refused naming its field."""
    config = (model_files / "config.json").read_text()
    (model_files / "config.json").write_text(config[:-1] + ", " + raw_field + "}")
    message = refused_and_nothing_left(team.project, zip_of(tmp_path / "tiny.zip", model_files), models_root)
    assert message == (f"tiny.zip/config.json: field {shown!r} holds half of a UTF-16 surrogate pair ({said}), "
                       "which is no text; fix the field"), message
