"""The Makefile's targets against README.md: each declared target has a recipe, and README names each one."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def declared_targets() -> set[str]:
    [phony] = re.findall(r"^\.PHONY:(.*)$", (ROOT / "Makefile").read_text(), re.M)
    return set(phony.split())


def targets_with_rules() -> set[str]:
    return set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))


def test_every_declared_target_has_a_rule():
    """`make lint` and `make bench` were declared with no rule: make said "Nothing to be done" and exited 0,
    which reads as a lint that passed."""
    assert sorted(declared_targets() - targets_with_rules()) == []


def test_the_readme_names_every_target():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert sorted(target for target in targets_with_rules() if f"make {target}" not in readme) == []
