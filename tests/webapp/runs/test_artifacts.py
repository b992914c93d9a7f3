"""The tar archives of a run's exports (webapp.runs.artifacts): what they hold, and that a large file is
sent a piece at a time."""
import io
import tarfile

from asgiref.sync import async_to_sync

from webapp.runs import artifacts


def test_a_file_is_sent_a_chunk_at_a_time(tmp_path, monkeypatch):
    monkeypatch.setattr(artifacts, "CHUNK_BYTES", 1024)
    export = tmp_path / "export"
    export.mkdir()
    weights = bytes(range(256)) * 20  # 5,120 bytes: five chunks
    (export / "model.safetensors").write_bytes(weights)
    (export / "config.json").write_text("{}")
    pieces = list(artifacts.tar_stream(export))
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
    stream = artifacts.asynchronous(artifacts.tar_stream(export))

    async def read_all():
        return b"".join([piece async for piece in stream])

    with tarfile.open(fileobj=io.BytesIO(async_to_sync(read_all)())) as archive:
        assert archive.getnames() == ["export/config.json"]


def test_the_serving_copy_and_the_copies_being_written_or_replaced_stay_on_the_server(tmp_path):
    export = tmp_path / "export"
    for name in ("quantized", ".quantized.writing-k2j4", ".quantized.replaced-9x1z", "adapter"):
        (export / name).mkdir(parents=True)
        (export / name / "model.safetensors").write_bytes(b"weights")
    (export / "config.json").write_text("{}")
    with tarfile.open(fileobj=io.BytesIO(b"".join(artifacts.tar_stream(export, leave_out=("quantized",))))) as archive:
        # jaxengine.quantize writes a copy aside and renames it into place: the aside directories were in the tar.
        assert archive.getnames() == ["export/adapter/model.safetensors", "export/config.json"]
