"""``jaxengine <command> --help``: every sub-command describes itself in plain text."""
import pytest

from jaxengine.cli import SUBCOMMANDS, main


@pytest.mark.parametrize("command", sorted(SUBCOMMANDS))
def test_help_describes_the_command_without_markup(command, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    out = capsys.readouterr().out
    assert exit_info.value.code == 0
    assert f"\njaxengine {command} " in out
    assert "`" not in out


def test_the_readme_names_every_flag_of_every_command():
    """Each option of each sub-command appears in a README paragraph that names the command."""
    import argparse
    from pathlib import Path

    from jaxengine.cli import build_parser

    paragraphs = (Path(__file__).resolve().parents[3] / "README.md").read_text(encoding="utf-8").split("\n\n")
    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    missing = []
    for command, parser in subparsers.choices.items():
        documented = "\n".join(paragraph for paragraph in paragraphs if f"jaxengine {command}" in paragraph)
        flags = [flag for action in parser._actions for flag in action.option_strings if flag not in ("-h", "--help")]
        missing += [command] if not documented else [f"{command} {flag}" for flag in flags if flag not in documented]
    assert missing == []
