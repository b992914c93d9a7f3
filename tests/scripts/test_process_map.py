"""docs/architecture.md's process map against scripts/up.sh: each worker the script starts has its row, with the
queue, process count, pool and options the script gives it."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def started_workers() -> list[list[str]]:
    """The arguments of each ``start_worker NAME QUEUE CONCURRENCY [POOL [OPTIONS...]]`` line of up.sh."""
    script = (ROOT / "scripts" / "up.sh").read_text()
    return [line.split()[1:] for line in script.splitlines() if re.match(r"start_worker \w", line)]


def process_rows() -> dict[str, str]:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## Processes\n", 1)[1].split("\n## ", 1)[0]
    return {match[1]: match[0] for match in re.finditer(r"^\| ([\w-]+) \|.*$", section, re.M)}


@pytest.mark.parametrize("arguments", started_workers(), ids=lambda arguments: arguments[0])
def test_the_process_map_gives_each_worker_its_command(arguments):
    """The map left out worker-default's --concurrency 2."""
    name, queue, concurrency, *rest = arguments
    pool, options = (rest[0], rest[1:]) if rest else ("prefork", [])
    row = process_rows()[f"worker-{name}"]
    expected = [f"-Q {queue}", f"--concurrency {concurrency}", *([f"--pool {pool}"] if pool != "prefork" else []),
                " ".join(options)]
    assert [part for part in expected if part not in row] == []
