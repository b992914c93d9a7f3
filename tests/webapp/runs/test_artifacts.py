"""The tar archives of a run's exports (webapp.runs.artifacts): what they hold."""
import io
import tarfile

from webapp.runs import artifacts


def test_the_serving_copy_and_the_copies_being_written_or_replaced_stay_on_the_server(tmp_path):
    export = tmp_path / "export"
    for name in ("quantized", ".quantized.writing-k2j4", ".quantized.replaced-9x1z", "adapter"):
        (export / name).mkdir(parents=True)
        (export / name / "model.safetensors").write_bytes(b"weights")
    (export / "config.json").write_text("{}")
    with tarfile.open(fileobj=io.BytesIO(b"".join(artifacts.tar_stream(export, leave_out=("quantized",))))) as archive:
        # jaxengine.quantize writes a copy aside and renames it into place: the aside directories were in the tar.
        assert archive.getnames() == ["export/adapter/model.safetensors", "export/config.json"]
