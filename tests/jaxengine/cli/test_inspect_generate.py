"""``jaxengine inspect`` and ``jaxengine generate`` end to end, on a tiny model directory saved by jaxengine."""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from jaxengine.checkpoint.hf import CheckpointError, load_hf_model
from jaxengine.cli import main
from jaxengine.cli.generate import sampling_settings
from jaxengine.sampler import Sampler, SamplingParams
from jaxengine.tokenizer import load_tokenizer
from tests import factories

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-qwen3-model"))


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.run([sys.executable, "-m", "jaxengine", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_inspect_describes_the_model(model_dir, capsys):
    result = run_cli("inspect", "--model", str(model_dir), "--json")
    assert result.returncode == 0, result.stderr
    facts = json.loads(result.stdout)
    reference = transformers.AutoModelForCausalLM.from_pretrained(model_dir)
    assert facts["architecture"] == "Qwen3ForCausalLM"
    assert facts["family"] == "qwen3"
    assert facts["parameters"] == sum(p.numel() for p in reference.parameters()) == facts["weights"]["elements"]
    assert facts["dtype"] == "float32" and facts["weights"]["dtypes"] == ["F32"]
    assert facts["context_length"] == 256
    tokenizer = load_tokenizer(model_dir)
    assert facts["tokenizer"] == {"type": "tokenizers", "vocab_size": tokenizer.vocab_size, "bos_id": None,
                                  "eos_ids": tokenizer.eos_ids, "pad_id": tokenizer.pad_id, "chat_template": "model"}

    assert main(["inspect", "--model", str(model_dir)]) == 0
    text = capsys.readouterr().out
    assert "Qwen3ForCausalLM (family qwen3)" in text
    assert f"({facts['parameters']:,})" in text
    assert "context length 256" in text
    assert "tokenizer      tokenizers, vocab 403" in text


def test_generate_json_is_the_samplers_greedy_output(model_dir):
    result = run_cli("generate", "--model", str(model_dir), "--prompt", "Hello world", "--max-new-tokens", "12",
                     "--temperature", "0", "--json")
    assert result.returncode == 0, result.stderr
    output = json.loads(result.stdout)
    assert set(output) == {"text", "token_ids", "prompt_token_ids"}
    tokenizer = load_tokenizer(model_dir)
    model, _ = load_hf_model(model_dir)
    [expected] = Sampler(model, tokenizer).generate(["Hello world"], SamplingParams(max_new_tokens=12, temperature=0))
    assert output["prompt_token_ids"] == tokenizer.encode("Hello world", add_special_tokens=True)
    assert output["token_ids"] == expected.token_ids and len(expected.token_ids) == 12
    assert output["text"] == expected.text


def test_generate_chat_uses_the_template_and_streams_text(model_dir, capsys):
    assert main(["generate", "--model", str(model_dir), "--prompt", "What is 2+2?", "--chat", "--system", "Be brief.",
                 "--max-new-tokens", "6", "--temperature", "0", "--json"]) == 0
    output = json.loads(capsys.readouterr().out)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    reference = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    expected_ids = reference.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert output["prompt_token_ids"] == list(expected_ids)

    assert main(["generate", "--model", str(model_dir), "--prompt", "What is 2+2?", "--chat", "--system", "Be brief.",
                 "--max-new-tokens", "6", "--temperature", "0"]) == 0
    assert capsys.readouterr().out == output["text"] + "\n"


def test_generate_chat_renders_the_prompt_as_training_and_the_chat_do(tmp_path, capsys):
    """QA: on the demo model (SentencePiece, add_bos_token false) training and the chat put BOS before the chat
    template, but generate --chat did not: an SFT of the demo answered "11" in the chat and nothing here."""
    from jaxengine.data.pipeline import encode_prompt

    from jaxengine.demo.tokenizer import DEMO_CHAT_TEMPLATE

    model_dir = factories.build_tiny_model_dir(tmp_path / "model", preset_name="tiny-llama",
                                               tokenizer_style="sentencepiece")
    config_path = model_dir / "tokenizer_config.json"  # the demo's settings: a template that writes no BOS
    config = json.loads(config_path.read_text())
    config.update(add_bos_token=False, chat_template=DEMO_CHAT_TEMPLATE)
    config_path.write_text(json.dumps(config))
    assert main(["generate", "--model", str(model_dir), "--prompt", "What is 2+2?", "--chat", "--system", "Be brief.",
                 "--max-new-tokens", "2", "--temperature", "0", "--json"]) == 0
    tokenizer = load_tokenizer(model_dir)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is 2+2?"}]
    assert tokenizer.bos_id is not None
    assert json.loads(capsys.readouterr().out)["prompt_token_ids"] == encode_prompt(tokenizer, messages)


def test_sampling_settings_fall_back_to_generation_config():
    flags = argparse.Namespace(temperature=None, top_k=None, top_p=0.5)
    assert sampling_settings(flags, {"do_sample": True, "temperature": 0.7, "top_k": 20, "top_p": 0.8}) == {
        "temperature": 0.7, "top_k": 20, "top_p": 0.5}
    assert sampling_settings(flags, {"do_sample": False, "temperature": 0.7}) == {
        "temperature": 0.0, "top_k": 0, "top_p": 0.5}
    assert sampling_settings(flags, {}) == {"temperature": 1.0, "top_k": 0, "top_p": 0.5}


def test_sampling_settings_read_a_null_in_generation_config_as_unset():
    """QA: "top_k": null (transformers writes null for an unset field) was a TypeError traceback."""
    flags = argparse.Namespace(temperature=None, top_k=None, top_p=None)
    assert sampling_settings(flags, {"do_sample": None, "temperature": None, "top_k": None, "top_p": None}) == {
        "temperature": 1.0, "top_k": 0, "top_p": 1.0}


@pytest.mark.parametrize("content, problem", [
    ('{"temperature": "0.7"}', "temperature = '0.7': expected a number"),
    ('{"top_k": 2.5}', "top_k = 2.5: expected a whole number"),
    ('{"do_sample": "yes"}', "do_sample = 'yes': expected true or false"),
    ('{"top_p": 0}', "top_p must be in (0, 1] (1 = off), got 0; fix the file or give --top-p"),
    ("[1]", "expected a JSON object at the top level, found list; fix or remove the file"),
], ids=["text for a number", "fraction for top_k", "text for a boolean", "out of range", "not an object"])
def test_generate_names_a_bad_generation_config_field(tmp_path, model_dir, capsys, content, problem):
    """QA: a sampling field of generation_config.json of the wrong type, or the file not an object, was a
    TypeError/AttributeError traceback; one out of range was blamed on a flag (--top-p) never given."""
    import shutil

    copy = shutil.copytree(model_dir, tmp_path / "model")
    (copy / "generation_config.json").write_text(content)
    assert main(["generate", "--model", str(copy), "--prompt", "x", "--max-new-tokens", "2"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"jaxengine generate: error: {copy / 'generation_config.json'}: {problem}\n"


@pytest.mark.parametrize("file", ["config.json", "tokenizer_config.json", "generation_config.json"])
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_model_file_that_is_not_utf8_is_named_in_one_line(tmp_path, model_dir, capsys, file, command):
    """QA: a model directory's JSON file holding bytes that are not UTF-8 (a file saved in another encoding, or
    a binary copied over it) was a UnicodeDecodeError traceback from inspect and generate."""
    import shutil

    copy = shutil.copytree(model_dir, tmp_path / "model")
    (copy / file).write_bytes(b'{"bos_token": "\xff"}')
    args = [command, "--model", str(copy)] + (["--prompt", "x", "--max-new-tokens", "2"] if command == "generate" else [])
    assert main(args) == 2
    advice = ("; a model's config.json is one JSON object as Hugging Face saves it, naming its architectures (one of "
              + SUPPORTED + "): save it again from the model's repository") if file == "config.json" \
        else "; fix or remove the file"
    assert capsys.readouterr().err == (f"jaxengine {command}: error: {copy / file}: not UTF-8 text (byte 15 is not "
                                       f"valid UTF-8){advice}\n")


@pytest.mark.parametrize("make_args, message", [
    (lambda tmp, model: ["generate", "--model", str(tmp / "missing"), "--prompt", "x"], "no such directory"),
    (lambda tmp, model: ["inspect", "--model", str(tmp)], "no config.json"),
    (lambda tmp, model: ["generate", "--model", str(model), "--prompt", "x", "--top-p", "0"], "--top-p must be in (0, 1]"),
    (lambda tmp, model: ["generate", "--model", str(model), "--prompt", "x", "--max-new-tokens", "0"],
     "--max-new-tokens must be at least 1, got 0"),
    (lambda tmp, model: ["generate", "--model", str(model), "--prompt", "x", "--system", "s"], "--system needs --chat"),
], ids=["missing dir", "no config.json", "bad top-p", "no new tokens", "system without chat"])
def test_it_rejects_bad_input_with_one_line(tmp_path, model_dir, make_args, message):
    result = run_cli(*make_args(tmp_path, model_dir))
    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr and result.stderr.count("\n") == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("config, message", [
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "lacks required field 'hidden_size'"),
    ({"architectures": ["FooForCausalLM"], "model_type": "foo"}, "is not supported; supported architectures"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": "four", "num_attention_heads": 4},
     "field 'num_hidden_layers' = 'four': expected a whole number"),
    # QA: these said "can't multiply sequence by non-int of type 'str'", "invalid literal for int() with
    # base 10: 'x'" (naming no field) or were an AttributeError traceback.
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": "2", "num_attention_heads": 4},
     "field 'num_hidden_layers' = '2': expected a whole number"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": "x"},
     "field 'max_position_embeddings' = 'x': expected a whole number"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "rope_parameters": "x"},
     "field 'rope_parameters' = 'x': expected a JSON object"),
    ({"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "num_hidden_layers": "four"},
     "field 'num_hidden_layers' = 'four': expected a whole number"),
    ({"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
      "text_config": {"rms_norm_eps": "small"}},
     "field 'text_config.rms_norm_eps' = 'small': expected a number"),
    # Audit: these said "invalid literal for int() with base 10: 'x'" (naming no field), "architectures=['L', 'l',
    # 'a', ...] is not supported", or were read as true (bool("false")), building a model of tied embeddings.
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "eos_token_id": "x"},
     "field 'eos_token_id' = 'x': expected a whole number or a list of them"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "eos_token_id": [1, "2"]},
     "field 'eos_token_id' = [1, '2']: expected a whole number or a list of them"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "bos_token_id": "1"},
     "field 'bos_token_id' = '1': expected a whole number"),
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "tie_word_embeddings": "false"},
     "field 'tie_word_embeddings' = 'false': expected true or false"),
    ({"architectures": "LlamaForCausalLM", "model_type": "llama"},
     "field 'architectures' = 'LlamaForCausalLM': expected a list of class names, e.g. [\"LlamaForCausalLM\"]"),
    # Audit: a context of 0 (or below) was described by inspect as "context length 0".
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": 0},
     "field 'max_position_embeddings' = 0: expected a positive whole number"),
    ({"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 64, "hidden_size": 32,
      "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "max_position_embeddings": -8},
     "field 'max_position_embeddings' = -8: expected a positive whole number"),
], ids=["missing field", "unsupported architecture", "a word for a number", "a number in quotes",
        "a word for the context", "rope not an object", "gemma3 word for a number", "gemma3 text_config",
        "a word for the eos id", "a word among the eos ids", "a bos id in quotes", "a word for a boolean",
        "architectures not a list", "a context of 0", "a negative context"])
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_it_rejects_a_bad_config_with_one_line(tmp_path, capsys, config, message, command):
    (tmp_path / "config.json").write_text(json.dumps(config))
    extra = ["--prompt", "x"] if command == "generate" else []
    assert main([command, "--model", str(tmp_path), *extra]) == 2
    error = capsys.readouterr().err
    assert message in error and error.count("\n") == 1 and error.startswith(f"jaxengine {command}: error: ")


def _with_field(file: str, field: str, value):
    """A damage of the model directory: ``file`` (``{}`` where missing) with ``field`` (dotted: a nested one) set."""
    def damage(model: Path) -> None:
        path = model / file
        document = json.loads(path.read_text()) if path.is_file() else {}
        *outer, last = field.split(".")
        inner = document
        for key in outer:
            inner = inner[key]
        inner[last] = value
        path.write_text(json.dumps(document))  # Infinity, NaN, 401 digits: as Python's json writes them
    return damage


NUMBERS_NO_MODEL_HOLDS = [
    ("config.json", "rms_norm_eps", 10**400, "an integer of 401 digits"),
    ("config.json", "rope_parameters.rope_theta", float("inf"), "inf"),
    ("config.json", "rms_norm_eps", float("nan"), "nan"),
    ("tokenizer_config.json", "model_max_length", float("inf"), "inf"),
    ("generation_config.json", "temperature", -10**400, "an integer of 401 digits"),
    ("generation_config.json", "max_length", float("inf"), "inf"),
]
NUMBER_IDS = ["config-401-digits", "config-nested-inf", "config-nan", "tokenizer-config-inf",
              "generation-config-401-digits", "generation-config-inf"]


@pytest.mark.parametrize("file, field, value, said", NUMBERS_NO_MODEL_HOLDS, ids=NUMBER_IDS)
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_number_no_model_holds_is_named_in_one_line(tmp_path, model_dir, capsys, file, field, value, said,
                                                      command):
    """Issue: in a hand-copied model folder, an integer past a float's range where a float is read (rms_norm_eps,
    rope_theta, a temperature) was an OverflowError traceback from inspect and generate, and 1e999 or NaN was
    taken as the value (a model built with an infinite rope_theta generated). Registration refused them; the
    engine's reader of a model's JSON files refuses them in its words, naming file and field."""
    import shutil

    broken = shutil.copytree(model_dir, tmp_path / "broken")
    _with_field(file, field, value)(broken)
    args = [command, "--model", str(broken)] + (["--prompt", "x", "--max-new-tokens", "2"] if command == "generate"
                                                else [])
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"jaxengine {command}: error: {broken / file}: field {field!r} is {said}, past the range "
                            "of the numbers a config holds (a float's, finite); fix the field\n")


@pytest.mark.parametrize("content, problem", [
    ('{"temperature": 1' + "0" * 4400 + "}", "a number of over 4,300 digits, more than any field takes"),
    ('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}", "it nests too deeply to be read"),
], ids=["4400-digits", "nested-100000-deep"])
def test_generate_names_a_generation_config_json_cannot_read(tmp_path, model_dir, capsys, content, problem):
    import shutil

    broken = shutil.copytree(model_dir, tmp_path / "broken")
    (broken / "generation_config.json").write_text(content)
    assert main(["generate", "--model", str(broken), "--prompt", "x", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err == (f"jaxengine generate: error: {broken / 'generation_config.json'}: not valid "
                                       f"JSON ({problem}); fix or remove the file\n")


def test_train_names_a_config_number_no_model_holds(tmp_path, model_dir, capsys):
    """The same reader under ``jaxengine train``: exit 2, the spec, the file and the field, no traceback."""
    import shutil

    import yaml

    broken = shutil.copytree(model_dir, tmp_path / "broken")
    _with_field("config.json", "rms_norm_eps", 10**400)(broken)
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps({"prompt": f"q{n}", "response": "a"}) + "\n"
                                                 for n in range(4)))
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump({"task": "sft", "model": str(broken), "output_dir": str(tmp_path / "run"),
                                    "data": {"train": str(tmp_path / "rows.jsonl"), "max_seq_len": 32},
                                    "train": {"max_steps": 1, "batch_size": 2, "eval_samples": 0}}))
    assert main(["train", str(spec), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.endswith(f"{spec}: model: {broken}: {broken / 'config.json'}: field 'rms_norm_eps' is an integer of "
                        "401 digits, past the range of the numbers a config holds (a float's, finite); fix the "
                        "field\n"), err


def test_generate_rejects_an_empty_prompt_naming_the_flag(model_dir, capsys):
    """QA: ``--prompt ""`` said 'prompt 0 is empty after tokenization', a sampler's words for a batch
    the command line never shows."""
    assert main(["generate", "--model", str(model_dir), "--prompt", ""]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == ("jaxengine generate: error: --prompt '' encodes to no tokens (this model's tokenizer "
                            "adds no start token), so there is nothing to continue; give some text to complete\n")


def test_it_rejects_a_model_dir_without_tokenizer(tmp_path, model_dir, capsys):
    broken = tmp_path / "no-tokenizer"
    broken.mkdir()
    for name in ("config.json", "model.safetensors"):
        (broken / name).write_bytes((model_dir / name).read_bytes())
    assert main(["generate", "--model", str(broken), "--prompt", "x"]) == 2
    assert "no tokenizer found" in capsys.readouterr().err


def test_generate_names_weights_cut_short(tmp_path, model_dir, capsys):
    """A truncated model.safetensors was a SafetensorError traceback."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(model_dir, cut)
    (cut / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:2000])
    assert main(["generate", "--model", str(cut), "--prompt", "x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jaxengine generate: error: ") and "Traceback" not in err


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_generate_reads_a_quantized_serving_copy_as_the_chat_serves_it(tmp_path, model_dir, capsys, scheme):
    """QA: generate --model on a run's export/quantized/ failed with "tensor ...down_proj.weight is missing
    from the checkpoint; the weights do not match config.json"."""
    from jaxengine.quantize import QuantScheme, export_quantized
    from jaxengine.serving import load_serving_model

    copy = tmp_path / scheme
    export_quantized(model_dir, copy, scheme=QuantScheme.named(scheme))
    assert main(["generate", "--model", str(copy), "--prompt", "Hello world", "--max-new-tokens", "6",
                 "--temperature", "0", "--json"]) == 0
    output = json.loads(capsys.readouterr().out)
    served = load_serving_model(copy)
    [expected] = Sampler(served.model, served.tokenizer).generate(
        ["Hello world"], SamplingParams(max_new_tokens=6, temperature=0))
    assert output["token_ids"] == expected.token_ids and len(expected.token_ids) == 6


SUPPORTED = ("LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, Gemma3ForCausalLM, "
             "Gemma3ForConditionalGeneration")


def test_inspect_says_what_a_directory_without_a_config_json_holds_and_what_is_supported(tmp_path):
    """QA: "--model DIR: no config.json; a Hugging Face model directory needs one" said neither what the directory held
    nor which models are read; a Hugging Face cache's repository folder (the model a snapshot below it) was one."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = run_cli("inspect", "--model", str(empty))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"jaxengine inspect: error: --model {empty}: no config.json (the directory is empty); give a Hugging "
        "Face-format model directory: its config.json (architectures one of " + SUPPORTED + "), its safetensors "
        "weights and its tokenizer\n")
    cache = tmp_path / "models--org--tiny"
    (cache / "snapshots" / "abc123").mkdir(parents=True)
    (cache / "snapshots" / "abc123" / "config.json").write_text("{}")
    (cache / "refs").mkdir()
    result = run_cli("inspect", "--model", str(cache))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"jaxengine inspect: error: --model {cache}: no config.json (the directory holds "
                                    "refs/, snapshots/; snapshots/abc123 holds a config.json: give that directory)")


@pytest.mark.parametrize("content, found", [
    ("{not json", "line 1: not valid JSON (Expecting property name enclosed in double quotes)"),
    ("[]", "expected a JSON object at the top level, found list"),
])
def test_inspect_says_what_a_config_json_that_is_no_config_holds_and_what_is_supported(tmp_path, content, found):
    """QA: a config.json that is not JSON (or not an object) was named with what was wrong, but not what it should
    be."""
    (tmp_path / "config.json").write_text(content)
    result = run_cli("inspect", "--model", str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"jaxengine inspect: error: {tmp_path / 'config.json'}: {found}; a model's config.json is one JSON object "
        "as Hugging Face saves it, naming its architectures (one of " + SUPPORTED + "): save it again from the "
        "model's repository\n")


def test_inspect_names_an_unsupported_architecture_and_those_supported(tmp_path):
    (tmp_path / "config.json").write_text('{"architectures": ["BertModel"], "model_type": "bert"}')
    result = run_cli("inspect", "--model", str(tmp_path))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (f"jaxengine inspect: error: {tmp_path / 'config.json'}: architectures=['BertModel'] "
                             f"(model_type='bert') is not supported; supported architectures: {SUPPORTED}\n")


def test_inspect_refuses_a_config_that_does_not_describe_the_weights(tmp_path, model_dir, capsys):
    """QA: the count was worked out from config.json, so a config that does not describe the weights beside it
    (here: a wider MLP) was reported as if it did; now it is refused, as generate and train refuse it."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    config["intermediate_size"] *= 2
    (copy / "config.json").write_text(json.dumps(config))
    assert main(["inspect", "--model", str(copy)]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"jaxengine inspect: error: {copy / 'config.json'} does not describe the weights: "
                            f"'model.layers.0.mlp.gate_proj.weight' in {copy / 'model.safetensors'} has shape "
                            f"[{config['intermediate_size'] // 2}, ")
    assert f"(intermediate_size = {config['intermediate_size']})" in error and error.count("\n") == 1


@pytest.mark.parametrize("command", ["generate", "inspect"])
def test_an_eos_token_the_vocabulary_lacks_is_refused_in_one_line(tmp_path, model_dir, capsys, command):
    """QA: it was given a new id past the weights' rows, and generate never stopped on it."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config["eos_token"] = "<|eot|>"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    extra = ["--prompt", "x", "--max-new-tokens", "1"] if command == "generate" else []
    assert main([command, "--model", str(copy), *extra]) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"jaxengine {command}: error: {copy / 'tokenizer_config.json'}: eos_token '<|eot|>' is "
                            f"not in the vocabulary ({copy / 'tokenizer.json'}) nor among its added tokens")
    assert error.count("\n") == 1


@pytest.mark.parametrize("command", ["generate", "inspect"])
def test_a_million_layers_is_refused_in_one_line_before_the_model_is_built(tmp_path, model_dir, command):
    """QA: ``num_hidden_layers: 1000000`` had generate build the model until it was killed for memory."""
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(model_dir, copy)
    config = json.loads((copy / "config.json").read_text())
    layers = config["num_hidden_layers"]
    config["num_hidden_layers"] = 1_000_000
    (copy / "config.json").write_text(json.dumps(config))
    extra = ["--prompt", "x", "--max-new-tokens", "1"] if command == "generate" else []
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    result = subprocess.run([sys.executable, "-m", "jaxengine", command, "--model", str(copy), *extra], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=90)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == (
        f"jaxengine {command}: error: {copy / 'config.json'}: num_hidden_layers is 1000000, but the weights hold "
        f"{layers} layers (the last, layer {layers - 1}, in {copy / 'model.safetensors'}); set num_hidden_layers to "
        f"{layers}, or use the weights this config.json was written for\n")



@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_inspect_counts_the_parameters_of_a_quantized_copy_as_its_source_has_them(tmp_path, model_dir, capsys,
                                                                                 scheme):
    from jaxengine.quantize import QuantScheme, export_quantized

    export_quantized(model_dir, tmp_path / scheme, scheme=QuantScheme.named(scheme))
    assert main(["inspect", "--model", str(tmp_path / scheme), "--json"]) == 0
    quantized = json.loads(capsys.readouterr().out)["parameters"]
    assert main(["inspect", "--model", str(model_dir), "--json"]) == 0
    assert quantized == json.loads(capsys.readouterr().out)["parameters"]


@pytest.mark.parametrize("file_name, content", [
    ("tokenizer.json", b'{"version": "1.0", "model": '),
    ("tokenizer_config.json", b"{not json"),
], ids=["tokenizer.json cut short", "tokenizer_config.json not JSON"])
def test_inspect_refuses_a_corrupt_tokenizer_with_one_line_naming_the_file(tmp_path, model_dir, file_name, content):
    """QA: inspect printed 'tokenizer none (...)' and exited 0 for a tokenizer file that cannot be read."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / file_name).write_bytes(content)
    result = run_cli("inspect", "--model", str(broken))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("jaxengine inspect: error: ") and result.stderr.count("\n") == 1
    assert str(broken / file_name) in result.stderr and "Traceback" not in result.stderr


def _tokenizer_config_with(**fields):
    """A damage of the model directory: its tokenizer_config.json with ``fields`` laid over it."""
    def damage(model: Path) -> None:
        config = json.loads((model / "tokenizer_config.json").read_text())
        (model / "tokenizer_config.json").write_text(json.dumps({**config, **fields}))
    return damage


@pytest.mark.parametrize("damage, file_name, problem", [
    (lambda model: (model / "chat_template.jinja").write_bytes(b"{{ messages }}\xff"), "chat_template.jinja",
     "not UTF-8 text (byte 14 is not valid UTF-8); fix or remove the file"),
    (_tokenizer_config_with(added_tokens_decoder=[{"content": "<a>"}]), "tokenizer_config.json",
     "field 'added_tokens_decoder' = [{'content': '<a>'}]: expected an object of token ids (strings of digits) to "
     "tokens, e.g. {\"0\": {\"content\": \"<unk>\"}}"),
    (_tokenizer_config_with(added_tokens_decoder={"unk": {"content": "<unk>"}}), "tokenizer_config.json",
     "added_tokens_decoder: 'unk' is not a token id; the keys are token ids as strings of digits, e.g. \"0\""),
    (_tokenizer_config_with(eos_token=5), "tokenizer_config.json",
     "field 'eos_token' = 5: expected a string or an object with a 'content' string"),
    (_tokenizer_config_with(additional_special_tokens=5), "tokenizer_config.json",
     "field 'additional_special_tokens' = 5: expected a list of special tokens"),
], ids=["chat_template.jinja not UTF-8", "added tokens in a list", "added token id not digits",
        "special token a number", "special tokens not a list"])
@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_tokenizer_file_with_a_field_it_cannot_hold_is_named_in_one_line(tmp_path, model_dir, capsys, damage,
                                                                         file_name, problem, command):
    """Audit: these were a UnicodeDecodeError, ValueError or AttributeError traceback from inspect and generate
    (and from base model registration, a server error), or named neither the file nor the field."""
    import shutil

    broken = shutil.copytree(model_dir, tmp_path / "broken")
    damage(broken)
    args = [command, "--model", str(broken)] + (["--prompt", "x", "--max-new-tokens", "2"] if command == "generate"
                                                else [])
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"jaxengine {command}: error: {broken / file_name}: {problem}\n"


@pytest.mark.parametrize("damage", ["a shard missing", "a file the index does not list", "an index not JSON"])
def test_inspect_reads_the_weights_files_the_loader_reads(sharded_tiny_hf_model_dir, tmp_path, capsys, damage):
    """Audit: inspect counted every *.safetensors file of the directory. A sharded checkpoint missing a shard (a
    download cut short) was described as a smaller model, exit 0, while generate and train refuse it; a weights file
    its index does not list (consolidated.safetensors beside the shards, as some Hugging Face repositories hold) was
    counted with them; a damaged index was not read at all."""
    import shutil

    model = shutil.copytree(sharded_tiny_hf_model_dir, tmp_path / "model")
    index = model / "model.safetensors.index.json"
    shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    reference = transformers.AutoModelForCausalLM.from_pretrained(model)
    assert main(["inspect", "--model", str(model), "--json"]) == 0
    weights = json.loads(capsys.readouterr().out)["weights"]
    assert weights["files"] == len(shards) > 1
    assert weights["elements"] == sum(p.numel() for p in reference.parameters())

    if damage == "a file the index does not list":
        shutil.copy(model / shards[0], model / "consolidated.safetensors")
        assert main(["inspect", "--model", str(model), "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["weights"] == weights
        return
    if damage == "a shard missing":
        (model / shards[-1]).unlink()
    else:
        index.write_text('{"weight_map": ')
    with pytest.raises(CheckpointError) as refused:  # as generate and train refuse it
        load_hf_model(model)
    refusal = str(refused.value)
    assert main(["inspect", "--model", str(model)]) == 2
    assert capsys.readouterr().err == f"jaxengine inspect: error: {refusal}\n"  # in the loader's words
    assert refusal.startswith(f"{model / shards[-1]}: listed in model.safetensors.index.json but missing"
                              if damage == "a shard missing" else f"{index}: not a safetensors index")


@pytest.mark.parametrize("command", ["inspect", "generate"])
def test_a_weights_path_that_is_not_a_file_is_named_in_one_line(tmp_path, model_dir, capsys, command):
    """Audit: a model.safetensors that is a directory (a copy gone wrong) was an IsADirectoryError traceback from
    inspect, and from generate an OSError 'No such device (os error 19)' naming no file."""
    import shutil

    broken = shutil.copytree(model_dir, tmp_path / "broken")
    (broken / "model.safetensors").unlink()
    (broken / "model.safetensors").mkdir()
    args = [command, "--model", str(broken)] + (["--prompt", "x", "--max-new-tokens", "2"] if command == "generate"
                                                else [])
    assert main(args) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"jaxengine {command}: error: {broken / 'model.safetensors'}: not a file (a directory?); "
                            "copy or convert the weights again\n")


def test_inspect_refuses_a_weights_file_whose_header_is_cut_short(tmp_path, model_dir, capsys):
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(model_dir, cut)
    (cut / "model.safetensors").write_bytes((model_dir / "model.safetensors").read_bytes()[:100])
    assert main(["inspect", "--model", str(cut)]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and str(cut / "model.safetensors") in error


def test_inspect_refuses_a_weights_file_cut_short_after_its_header(tmp_path, model_dir, capsys):
    """QA: a model.safetensors whose copy stopped after its header was described as a whole model (its
    parameters counted from the header), while generate and train refused it."""
    import shutil

    cut = tmp_path / "cut"
    shutil.copytree(model_dir, cut)
    whole = (model_dir / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(whole[: len(whole) - 1000])
    assert main(["inspect", "--model", str(cut)]) == 2
    data_bytes = len(whole) - 8 - int.from_bytes(whole[:8], "little")  # after the length and the header
    assert capsys.readouterr().err == (
        f"jaxengine inspect: error: {cut / 'model.safetensors'}: the header places tensor data up to byte "
        f"{data_bytes} of the data section, but the file holds {data_bytes - 1000}; the file is truncated (an "
        "interrupted download or copy?): copy it again\n")


def _with_a_dtype_safetensors_lacks(whole: bytes) -> bytes:
    """``whole``, a safetensors file, with its first tensor's dtype in the header made F99."""
    header = json.loads(whole[8:8 + int.from_bytes(whole[:8], "little")])
    header[next(name for name in header if name != "__metadata__")]["dtype"] = "F99"
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + whole[8 + int.from_bytes(whole[:8], "little"):]


@pytest.mark.parametrize("damage", ["cut short", "bytes after the last tensor", "a dtype safetensors lacks"])
def test_inspect_refuses_what_registration_and_the_loader_refuse_in_the_same_words(tmp_path, model_dir, capsys,
                                                                                  damage):
    """jaxengine inspect read safetensors headers its own way: a file with bytes after its last tensor, which
    the loader refuses (so generate and train fail on it) and registration refuses, was described as a whole
    model; it now reads them with registration's reader, which words each refusal alike."""
    import shutil

    from safetensors import SafetensorError, safe_open

    from jaxengine.checkpoint.safetensors_header import read_safetensors_header

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    whole = (model_dir / "model.safetensors").read_bytes()
    weights = broken / "model.safetensors"
    weights.write_bytes({"cut short": whole[:-1000], "bytes after the last tensor": whole + b"\0" * 16,
                         "a dtype safetensors lacks": _with_a_dtype_safetensors_lacks(whole)}[damage])
    with pytest.raises(SafetensorError):
        with safe_open(str(weights), framework="numpy"):
            pass
    with pytest.raises(ValueError) as refused:
        read_safetensors_header(weights)
    assert main(["inspect", "--model", str(broken)]) == 2
    assert capsys.readouterr().err == f"jaxengine inspect: error: {refused.value}\n"


@pytest.mark.parametrize("template_file", [False, True], ids=["in tokenizer_config.json", "chat_template.jinja"])
@pytest.mark.parametrize("template, problem", [
    ("{{ raise_exception('System role not supported') }}", "chat template line 1: System role not supported"),
    ("{% for m in messages %}{{ m.content }", "chat template line 1: unexpected '}'"),
], ids=["raises", "invalid jinja"])
def test_generate_names_the_file_of_a_chat_template_that_fails(tmp_path, model_dir, capsys, template_file,
                                                                template, problem):
    """QA: a model's chat template that raised or did not parse said only 'chat template: ...', not which
    of the two files that may hold it (chat_template.jinja, tokenizer_config.json) to fix."""
    import shutil

    copy = shutil.copytree(model_dir, tmp_path / "model")
    config = json.loads((copy / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    if template_file:
        (copy / "chat_template.jinja").write_text(template)
        source = copy / "chat_template.jinja"
    else:
        config["chat_template"] = template
        source = copy / "tokenizer_config.json"
    (copy / "tokenizer_config.json").write_text(json.dumps(config))
    assert main(["generate", "--model", str(copy), "--prompt", "x", "--chat", "--max-new-tokens", "2"]) == 2
    assert capsys.readouterr().err == f"jaxengine generate: error: {source}: {problem}\n"


def test_generate_names_a_prompt_the_models_vocabulary_does_not_cover(tiny_hf_model_dir, tmp_path, capsys):
    """QA: a model directory holding another model's tokenizer said 'prompt 0 has token id ...', a batch row
    the command line never shows."""
    import shutil

    model = shutil.copytree(tiny_hf_model_dir("qwen2"), tmp_path / "model")
    factories.build_bpe_tokenizer_dir(tmp_path / "tokenizer", style="qwen")
    for path in (tmp_path / "tokenizer").iterdir():
        if path.name != "generation_config.json":
            shutil.copyfile(path, model / path.name)
    capsys.readouterr()  # transformers' progress bar, saving the tiny model
    assert main(["generate", "--model", str(model), "--prompt", "hello world", "--max-new-tokens", "2"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("jaxengine generate: error: --prompt 'hello world' encodes to token id ")
    assert error.endswith(f" outside the model's vocabulary (vocab_size=256 in {model / 'config.json'}): the "
                          "tokenizer is not the model's own; give the model directory its own tokenizer files\n")


def test_ctrl_c_stops_a_command_with_one_line_and_exit_130(model_dir, capsys, monkeypatch):
    """QA: Ctrl-C during ``jaxengine generate`` printed a KeyboardInterrupt traceback."""
    from jaxengine.cli import generate

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(generate, "_generate", interrupted)
    assert main(["generate", "--model", str(model_dir), "--prompt", "x"]) == 130
    assert capsys.readouterr().err == "\njaxengine generate: interrupted\n"


def test_generate_names_its_flags_when_the_prompt_and_new_tokens_outrun_the_context(model_dir, capsys):
    """QA: the sampler's message said 'max_new_tokens', a name the command line does not take."""
    assert main(["generate", "--model", str(model_dir), "--prompt", "hello", "--max-new-tokens", "300"]) == 2
    error = capsys.readouterr().err
    assert error.startswith("jaxengine generate: error: --prompt is ")
    assert error.endswith(f" tokens and --max-new-tokens 300: together past the model's context length (256, "
                          f"max_position_embeddings in {model_dir / 'config.json'}); shorten the prompt or lower "
                          "--max-new-tokens\n")


def test_generate_without_max_new_tokens_fits_the_answer_to_the_context(model_dir, capsys):
    """QA: the default of 256 new tokens refused every prompt of a model whose context is 256 tokens (the demo
    model's): `jaxengine generate --model DIR --prompt hi` failed out of the box. Left out, it is now what the
    context leaves after the prompt, up to 256; a prompt that fills the context alone is still refused."""
    import json

    assert main(["generate", "--model", str(model_dir), "--prompt", "hello", "--temperature", "0", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert 1 <= len(result["token_ids"]) <= 256 - len(result["prompt_token_ids"])
    assert main(["generate", "--model", str(model_dir), "--prompt", "hello " * 300]) == 2
    assert capsys.readouterr().err.endswith(" tokens and at least one new token: together past the model's context "
                                            f"length (256, max_position_embeddings in {model_dir / 'config.json'}); "
                                            "shorten the prompt or lower --max-new-tokens\n")


def test_inspect_names_the_licence_an_export_carries(tmp_path, model_dir, capsys):
    assert main(["inspect", "--model", str(model_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["licence"] == {"files": [], "not_copied": []}
    assert main(["inspect", "--model", str(model_dir)]) == 0
    assert "licence        not stated (no license in README.md's front matter" in capsys.readouterr().out

    licensed = tmp_path / "licensed"
    shutil.copytree(model_dir, licensed)
    (licensed / "README.md").write_text("---\nlicense: llama3.1\nlicense_link: https://llama.example/terms\n---\n# x\n")
    (licensed / "LICENSE").write_text("terms")
    (licensed / "USE_POLICY.md").write_text("policy")
    assert main(["inspect", "--model", str(licensed), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["licence"] == {
        "license": "llama3.1", "license_link": "https://llama.example/terms", "files": ["LICENSE", "USE_POLICY.md"],
        "not_copied": []}
    assert main(["inspect", "--model", str(licensed)]) == 0
    assert ("licence        llama3.1, https://llama.example/terms; files: LICENSE, USE_POLICY.md"
            in capsys.readouterr().out)
