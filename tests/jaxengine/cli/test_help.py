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


def test_every_option_with_a_default_says_it_in_its_help():
    """validate-data --max-errors (20) and generate --dtype (float32) had defaults their help did not give."""
    import argparse

    from jaxengine.cli import build_parser

    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    unsaid = [f"{command} {action.option_strings[0]}" for command, parser in subparsers.choices.items()
              for action in parser._actions
              if action.option_strings and isinstance(action.default, (int, float, str))
              and not isinstance(action.default, bool) and action.default != argparse.SUPPRESS
              and f"default {action.default}" not in (action.help or "")]
    assert unsaid == []


@pytest.mark.parametrize("argv, unknown", [
    (["inspect", "--model", "m", "--jsn"], "--jsn"),
    (["train", "a.yaml", "b.yaml"], "b.yaml"),
])
def test_an_unknown_argument_is_refused_by_its_command_with_its_usage(capsys, argv, unknown):
    """QA: `jaxengine inspect --model m --jsn` was refused as 'jaxengine: error: unrecognized arguments: --jsn'
    under the list of commands, not as the README's `jaxengine <command>: error: ...` with that command's flags."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith(f"usage: jaxengine {argv[0]} ")
    assert err.endswith(f"\njaxengine {argv[0]}: error: unrecognized arguments: {unknown}\n")


def documented_invocations() -> list[tuple[str, str, str]]:
    """(document, sub-command, the rest of the line) of every ``jaxengine COMMAND ...`` the README and
    docs/architecture.md write in code (a span or a fenced block), and of a span that starts ``COMMAND --flag``."""
    import re
    from pathlib import Path

    from jaxengine.cli import SUBCOMMANDS

    root = Path(__file__).resolve().parents[3]
    names = "|".join(sorted(map(re.escape, SUBCOMMANDS), key=len, reverse=True))
    found = []
    for doc in ("README.md", "docs/architecture.md"):
        codes, fenced, prose = [], False, []
        for line in (root / doc).read_text(encoding="utf-8").splitlines() + [""]:
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif fenced and line.startswith(" ") and codes:
                codes[-1] += " " + line.strip()  # a command's continuation line, as the README's generate
            elif fenced:
                codes.append(line)
            elif line.strip():
                prose.append(line)
            else:  # a paragraph's spans, one may run over a line break (validate-data's); a ```json in a table
                codes += re.findall(r"`([^`]+)`", re.sub(r"`{3,}", "", " ".join(prose)))  # cell is no span's edge
                prose = []
        for code in codes:
            match = re.search(rf"\bjaxengine ({names})(?![\w-])(.*)", code) or re.match(rf"({names}) (--.*)", code)
            if match:
                found.append((doc, match.group(1), match.group(2).split("#")[0]))
    return found


def test_every_flag_the_docs_give_a_command_is_one_of_its_own_with_a_value_it_takes():
    """The other direction of test_the_readme_names_every_flag_of_every_command: a flag the docs write after
    `jaxengine COMMAND` (or a value written for a flag with fixed choices, `--metric exact_match|loss`) that the
    command's parser does not take would be refused as written."""
    import argparse
    import re

    from jaxengine.cli import build_parser

    subparsers = next(action for action in build_parser()._actions if isinstance(action, argparse._SubParsersAction))
    invocations = documented_invocations()
    assert {command for _doc, command, _rest in invocations} == set(subparsers.choices)
    wrong = []
    for doc, command, rest in invocations:
        options = {flag: action for action in subparsers.choices[command]._actions for flag in action.option_strings}
        for flag, value in re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)(?:[ =]([\w.|-]+))?", rest):
            if flag not in options:
                wrong.append(f"{doc}: jaxengine {command} {flag}")
            elif options[flag].choices and value and not value.isupper():
                wrong += [f"{doc}: jaxengine {command} {flag} {each}" for each in value.split("|")
                          if each not in options[flag].choices]
    assert wrong == []
