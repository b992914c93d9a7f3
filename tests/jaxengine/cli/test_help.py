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
