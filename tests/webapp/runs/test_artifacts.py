"""The tar archives of a run's exports (webapp.runs.artifacts): what they hold, and that a large file is
sent a piece at a time."""
import io
import tarfile

from asgiref.sync import async_to_sync

from webapp.runs import artifacts
from webapp.runs.models import ArtifactKind


def test_a_file_is_sent_a_chunk_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "CHUNK_BYTES", 1024)
    export = tmp_path / "export"
    export.mkdir()
    weights = bytes(range(256)) * 20  # 5,120 bytes: five chunks
    (export / "model.safetensors").write_bytes(weights)
    (export / "config.json").write_text("{}")
    pieces = list(artifacts.tar_stream(export, kind=ArtifactKind.MODEL))
    # The file was read into one buffer whole before any of it went out: a model's gigabytes in memory.
    assert max(map(len, pieces)) <= 1024
    with tarfile.open(fileobj=io.BytesIO(b"".join(pieces))) as archive:
        assert archive.getnames() == ["export/config.json", "export/model.safetensors"]
        assert archive.extractfile("export/model.safetensors").read() == weights
        assert archive.extractfile("export/config.json").read() == b"{}"


def test_the_response_is_sent_from_an_asynchronous_iterator(tmp_path):
    # Django's ASGI handler (uvicorn serves Temper) reads a synchronous iterator whole into a list
    # before it sends a byte; an asynchronous one is sent as it is read.
    export = tmp_path / "export"
    export.mkdir()
    (export / "config.json").write_text("{}")
    stream = artifacts.asynchronous(artifacts.tar_stream(export, kind=ArtifactKind.MODEL))

    async def read_all():
        return b"".join([piece async for piece in stream])

    with tarfile.open(fileobj=io.BytesIO(async_to_sync(read_all)())) as archive:
        assert archive.getnames() == ["export/config.json"]


def test_the_merged_model_leaves_out_its_adapter_its_serving_copy_and_the_copies_being_written(tmp_path):
    export = tmp_path / "export"
    for name in ("quantized", ".quantized.writing-k2j4", ".quantized.replaced-9x1z", "adapter"):
        (export / name).mkdir(parents=True)
        (export / name / "model.safetensors").write_bytes(b"weights")
    (export / "config.json").write_text("{}")
    (export / "reward_head.safetensors").write_bytes(b"head")  # a reward model's: part of the model
    with tarfile.open(fileobj=io.BytesIO(b"".join(artifacts.tar_stream(export, kind=ArtifactKind.MODEL)))) as archive:
        # jaxengine.quantize writes a copy aside and renames it into place: the aside directories were in the
        # tar; and the LoRA adapter, which has its own download, was in the merged model's.
        assert archive.getnames() == ["export/config.json", "export/reward_head.safetensors"]
    # An exported checkpoint keeps its adapter (it has no download of its own), not its serving copy.
    checkpoint = artifacts.downloaded_files(export, kind=ArtifactKind.CHECKPOINT)
    assert [str(path.relative_to(export)) for path in checkpoint] == [
        "adapter/model.safetensors", "config.json", "reward_head.safetensors"]
