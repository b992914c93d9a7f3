"""``jaxengine demo-base``: sizes that cannot build a model are refused before anything is written."""
import pytest

from jaxengine.cli import main


@pytest.mark.parametrize("flags, message", [
    (["--steps", "0"], "--steps must be at least 1, got 0"),
    (["--steps", "-5"], "--steps must be at least 1, got -5"),
    (["--seed", "-1"], "--seed must be ≥ 0, got -1"),
])
def test_it_rejects_sizes_that_cannot_build_naming_the_flag(tmp_path, capsys, flags, message):
    assert main(["demo-base", "--out", str(tmp_path / "demo"), "--no-progress", *flags]) == 2
    assert capsys.readouterr().err == f"jaxengine demo-base: error: {message}\n"
    assert not (tmp_path / "demo").exists()


def test_an_out_that_is_a_file_is_refused_in_one_line(tmp_path, capsys):
    """It was a NotADirectoryError traceback."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["demo-base", "--out", str(afile), "--no-progress"]) == 2
    assert f"--out {afile} is a file; give a directory" in capsys.readouterr().err


def test_an_out_below_a_file_is_refused_in_one_line(tmp_path, capsys):
    """Docs audit: `--out afile/demo` (a file on the way) built the corpus and tokenizer, then ended in a
    NotADirectoryError traceback, where the CLI's bad input is one `jaxengine demo-base: error:` line, exit 2."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(["demo-base", "--out", str(afile / "demo"), "--no-progress", "--steps", "1"]) == 2
    assert capsys.readouterr().err == (f"jaxengine demo-base: error: --out {afile / 'demo'}: {afile} is a file, not a "
                                       "directory; give a directory (it is made if missing)\n")
