"""What README.md says of the demo model's sizes is what `jaxengine demo-base` builds."""
import re
from pathlib import Path

from jaxengine.demo.build import DemoSettings, demo_model_config

README = Path(__file__).resolve().parents[3] / "README.md"


def test_the_readme_gives_the_demo_model_s_context_length():
    """QA: the generate section said "the demo model's context is 256 tokens" while the demo model's config.json says
    2048 (`jaxengine inspect` prints it): a user sizing --max-new-tokens by the README was told the wrong limit."""
    config = demo_model_config(DemoSettings(), vocab_size=1024, bos_id=2, eos_ids=[3], pad_id=0)
    stated = re.findall(r"the demo model's context is\s+([\d,]+) tokens", README.read_text(encoding="utf-8"))
    assert stated and {int(number.replace(",", "")) for number in stated} == {config.max_position_embeddings}
