"""Settings: every environment variable they read is documented in the README's configuration table."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_documents_every_variable_the_settings_read():
    read = set(re.findall(r'env_\w+\(\s*"([A-Z0-9_]+)"', (ROOT / "webapp" / "settings.py").read_text()))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    table = readme.split("\n## Configuration (environment variables)\n", 1)[1].split("\n## ", 1)[0]
    documented = {name for row in table.splitlines() if row.startswith("| `")
                  for name in re.findall(r"`([A-Z0-9_]+)`", row.split(" | ")[0])}
    assert "TEMPER_DATA" in read and "DATABASE_URL" in read
    assert sorted(read - documented) == []
