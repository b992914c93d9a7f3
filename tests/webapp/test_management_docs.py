"""Temper's own manage.py commands against README.md: each is named there, with every option it takes."""
import re
from pathlib import Path

import pytest
from django.core.management import BaseCommand, get_commands, load_command_class

ROOT = Path(__file__).resolve().parents[2]


def temper_commands() -> dict[str, str]:
    """``{command: its app}`` for the commands the webapp apps define (Django's own are Django's to document)."""
    return {name: app for name, app in get_commands().items() if app.startswith("webapp.")}


@pytest.mark.parametrize("command", sorted(temper_commands()))
def test_the_readme_names_the_command_and_every_option_of_it(command):
    """temper_setup's --no-demo-model was in no document."""
    parser = load_command_class(temper_commands()[command], command).create_parser("manage.py", command)
    base_options = {option for action in BaseCommand().create_parser("manage.py", command)._actions
                    for option in action.option_strings}
    options = [option for action in parser._actions for option in action.option_strings
               if option.startswith("--") and option not in base_options]
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(rf"`[^`]*\b{command}\b", readme)
    assert [option for option in options if option not in readme] == []
