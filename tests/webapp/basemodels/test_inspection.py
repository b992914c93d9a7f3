import json
import struct

import pytest

from tests.webapp.factories import TINY_LLAMA_PARAMETERS, write_model_dir
from webapp.basemodels.inspection import ModelDirError, read_model_facts, resolve_model_dir


@pytest.fixture
def root(tmp_path):
    models_root = tmp_path / "models"
    models_root.mkdir()
    return models_root


def test_it_reads_a_single_file_model(root):
    model_dir = write_model_dir(root / "tiny")
    facts = read_model_facts(resolve_model_dir("tiny", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")
    assert facts.parameter_count == TINY_LLAMA_PARAMETERS  # all float32
    assert (facts.architecture, facts.model_type, facts.dtype) == ("LlamaForCausalLM", "llama", "F32")
    assert (facts.context_length, facts.vocab_size, facts.tokenizer_type) == (256, 64, "tokenizer.json")
    assert facts.weight_files == ("model.safetensors",)
    assert facts.size_bytes == (model_dir / "model.safetensors").stat().st_size


def test_it_reads_how_many_ids_the_tokenizer_has_beside_the_embedding_rows(root):
    """config.json's vocab_size is the embedding's rows, often padded past the tokenizer's ids."""
    write_model_dir(root / "padded", tokenizer_ids=50)
    facts = read_model_facts(resolve_model_dir("padded", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")
    assert (facts.vocab_size, facts.tokenizer_vocab_size) == (64, 50)


@pytest.mark.parametrize("name", ["model.embed_tokens.weight", "lm_head.weight",
                                  "model.language_model.embed_tokens.weight"])
def test_a_vocab_size_the_embedding_does_not_have_is_refused_naming_both(root, name):
    """QA: a config.json whose vocab_size (64) is not the embedding's rows (60) was registered, and the first
    run or chat on it failed at load."""
    write_model_dir(root / "tiny", shapes={name: (60, 8), "norm.weight": (8,)})
    with pytest.raises(ModelDirError) as error:
        read_model_facts(resolve_model_dir("tiny", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")
    assert str(error.value) == (
        f"{root / 'tiny' / 'config.json'}: vocab_size is 64, but {name!r} in {root / 'tiny' / 'model.safetensors'} "
        "has 60 rows (one per token id); set vocab_size to 60, or register the weights this config.json was "
        "written for")


def test_a_tokenizer_it_cannot_read_leaves_its_vocabulary_unknown(root):
    write_model_dir(root / "tiny")  # tokenizer.json holds "{}"
    assert read_model_facts(resolve_model_dir("tiny", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha").tokenizer_vocab_size is None


@pytest.mark.parametrize("file_name, content", [
    ("chat_template.jinja", b"{{ messages }}\xff"),
    ("tokenizer_config.json", b'{"chat_template": 5}'),
    ("tokenizer_config.json", b'{"added_tokens_decoder": [{"content": "<a>"}]}'),
    ("tokenizer_config.json", b'{"added_tokens_decoder": {"unk": {"content": "<unk>"}}}'),
    ("tokenizer_config.json", b'{"additional_special_tokens": 5}'),
], ids=["template not UTF-8", "template not a string", "added tokens in a list", "added token id not digits",
        "special tokens not a list"])
def test_tokenizer_files_it_cannot_read_leave_the_vocabulary_unknown_not_a_server_error(root, file_name, content):
    """Audit: these raised UnicodeDecodeError, ChatTemplateError, AttributeError, ValueError or TypeError out of
    the registration (a server error on the Base models page), where a tokenizer it cannot read is registered
    with its vocabulary unknown (its runs and chats say why)."""
    model_dir = write_model_dir(root / "tiny", tokenizer_ids=50)
    (model_dir / file_name).write_bytes(content)
    assert read_model_facts(resolve_model_dir("tiny", models_root=root, project_slug="alpha"), models_root=root,
                            project_slug="alpha").tokenizer_vocab_size is None


def test_it_sums_a_sharded_model_via_its_index(root):
    write_model_dir(root / "sharded", shards=3, tokenizer="tokenizer.model")
    facts = read_model_facts(resolve_model_dir(str(root / "sharded"), models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")
    assert facts.parameter_count == TINY_LLAMA_PARAMETERS
    assert len(facts.weight_files) == 3
    assert facts.tokenizer_type == "sentencepiece"


def test_parameter_count_matches_transformers(root):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    model.save_pretrained(root / "llama", max_shard_size="20KB")
    (root / "llama" / "tokenizer.json").write_text("{}")
    facts = read_model_facts(resolve_model_dir("llama", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")
    assert len(facts.weight_files) > 1, "the tiny model should be sharded by max_shard_size"
    assert facts.parameter_count == sum(p.numel() for p in model.parameters())
    assert (facts.context_length, facts.vocab_size, facts.architecture) == (512, 128, "LlamaForCausalLM")


def test_it_rejects_dot_dot(root):
    write_model_dir(root / "tiny")
    with pytest.raises(ModelDirError, match=r"contains '\.\.'"):
        resolve_model_dir("tiny/../tiny", models_root=root, project_slug="alpha")
    with pytest.raises(ModelDirError, match=r"contains '\.\.'"):
        resolve_model_dir(str(root / ".." / "models" / "tiny"), models_root=root, project_slug="alpha")


def test_it_rejects_paths_outside_the_root(root, tmp_path):
    outside = write_model_dir(tmp_path / "outside")
    with pytest.raises(ModelDirError, match="not a directory under the models root"):
        resolve_model_dir(str(outside), models_root=root, project_slug="alpha")


def test_a_path_outside_the_root_gets_one_message_whether_or_not_it_exists(root, tmp_path):
    """QA: an existing path outside the root was 'X resolves to Y, outside the models root' and a missing one
    'X does not exist', so the register form told anyone whether any path on the server existed."""
    outside_dir = write_model_dir(tmp_path / "outside")
    (tmp_path / "a-file").write_text("x")
    (root / "link").symlink_to(outside_dir, target_is_directory=True)
    (root / "dangling").symlink_to(tmp_path / "nothing-here", target_is_directory=True)
    given = [str(outside_dir), str(tmp_path / "a-file"), str(tmp_path / "nothing-here"),
             str(tmp_path / "nothing-here" / "deeper"), "/etc", "/no-such-dir-anywhere", "link", "dangling",
             "link/config.json", "dangling/more"]
    messages = set()
    for raw in given:
        with pytest.raises(ModelDirError) as error:
            resolve_model_dir(raw, models_root=root, project_slug="alpha")
        shown = raw if raw.startswith("/") else str(root.resolve() / raw)
        assert str(error.value).startswith(f"{shown}: ")
        messages.add(str(error.value).removeprefix(f"{shown}: "))
    [message] = messages
    assert message == (f"not a directory under the models root {root.resolve()}; copy or move the model under the "
                       "root (symlinks there may not point outside it)")


def test_it_rejects_symlink_escapes(root, tmp_path):
    outside = write_model_dir(tmp_path / "outside")
    (root / "link").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ModelDirError, match="symlinks there may not point outside"):
        resolve_model_dir("link", models_root=root, project_slug="alpha")


def test_it_follows_symlinks_that_stay_inside(root):
    real = write_model_dir(root / "real")
    (root / "alias").symlink_to(real, target_is_directory=True)
    assert resolve_model_dir("alias", models_root=root, project_slug="alpha") == real.resolve()


@pytest.mark.parametrize("raw", ["", "missing"])
def test_it_rejects_missing_directories(root, raw):
    with pytest.raises(ModelDirError):
        resolve_model_dir(raw, models_root=root, project_slug="alpha")


def test_it_rejects_a_file(root):
    write_model_dir(root / "tiny")
    with pytest.raises(ModelDirError, match="is a file"):
        resolve_model_dir("tiny/config.json", models_root=root, project_slug="alpha")


def test_it_rejects_directories_without_config_weights_or_tokenizer(root):
    (root / "empty").mkdir()
    with pytest.raises(ModelDirError, match="no config.json"):
        read_model_facts(root / "empty", models_root=root, project_slug="alpha")
    model_dir = write_model_dir(root / "noweights")
    (model_dir / "model.safetensors").unlink()
    with pytest.raises(ModelDirError, match="no safetensors weights"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    model_dir = write_model_dir(root / "notok")
    (model_dir / "tokenizer.json").unlink()
    with pytest.raises(ModelDirError, match="no tokenizer"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


def test_it_rejects_corrupt_headers(root):
    model_dir = write_model_dir(root / "corrupt")
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", 10**12) + b"{}")
    with pytest.raises(ModelDirError, match="implausible"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", 5) + b"{no")
    with pytest.raises(ModelDirError, match="truncated"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", 3) + b"{no")
    with pytest.raises(ModelDirError, match="not valid JSON"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


def test_it_rejects_shards_outside_the_directory(root):
    model_dir = write_model_dir(root / "evil", shards=2)
    index = model_dir / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"a": "../other.safetensors"}}))
    with pytest.raises(ModelDirError, match="outside the model directory"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    index.write_text(json.dumps({"weight_map": {"a": "missing.safetensors"}}))
    with pytest.raises(ModelDirError, match="listed but missing"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


def test_it_never_imports_jax():
    import subprocess
    import sys

    code = "import sys, webapp.basemodels.inspection; sys.exit('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_it_refuses_an_architecture_no_family_loads_naming_the_supported_ones(root):
    model_dir = write_model_dir(root / "bert")
    (model_dir / "config.json").write_text(json.dumps({"architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    with pytest.raises(ModelDirError) as refused:
        read_model_facts(resolve_model_dir("bert", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")
    message = str(refused.value)
    assert "BertForMaskedLM" in message and "config.json" in message
    assert all(name in message for name in ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM", "Gemma3ForCausalLM"))
    # A config naming no architecture is read by its model_type, as the engine reads it.
    (model_dir / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64, "hidden_size": 8,
                                                        "intermediate_size": 16, "num_hidden_layers": 1,
                                                        "num_attention_heads": 2, "tie_word_embeddings": True}))
    assert read_model_facts(resolve_model_dir("bert", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha").architecture == "llama"


def _with_config(model_dir, **changes):
    config = json.loads((model_dir / "config.json").read_text())
    config.update(changes)
    (model_dir / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize("changes, message", [
    ({"architectures": 5}, "'architectures' must be a list of class names"),
    ({"architectures": "LlamaForCausalLM"}, "'architectures' must be a list of class names"),
    ({"model_type": 7, "architectures": []}, "'model_type' must be a string"),
    ({"text_config": [1, 2]}, "'text_config' must be a JSON object"),
    ({"max_position_embeddings": 10**20}, "max_position_embeddings is 100000000000000000000; give the model's real"),
    ({"hidden_size": None}, "a llama model's config needs 'hidden_size', which is missing"),
    ({"num_hidden_layers": "4"}, "num_hidden_layers is '4'; it must be a positive whole number"),
    ({"vocab_size": -5}, "vocab_size is -5; it must be a positive whole number"),
    # Audit: registered, and the first run or chat on the model failed reading its config.json (the eos id as
    # "invalid literal for int() with base 10: 'x'"), or read "false" as true (a model of tied embeddings).
    ({"eos_token_id": "x"}, "field 'eos_token_id' = 'x': expected a whole number or a list of them"),
    ({"tie_word_embeddings": "false"}, "field 'tie_word_embeddings' = 'false': expected true or false"),
    ({"rms_norm_eps": "small"}, "field 'rms_norm_eps' = 'small': expected a number"),
])
def test_a_malformed_config_is_named_not_a_500(root, changes, message):
    """QA registered these: each was a 500 page (TypeError, AttributeError, OverflowError at the INSERT), or,
    without hidden_size, a model whose first run failed at load."""
    model_dir = write_model_dir(root / "bad")
    _with_config(model_dir, **changes)
    with pytest.raises(ModelDirError, match="config.json: " + __import__("re").escape(message)):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


@pytest.mark.parametrize("entry, message", [
    ({"dtype": "F32", "shape": [10**20], "data_offsets": [0, 4]}, "no valid dtype and shape"),
    ({"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}, "no valid dtype and shape"),
    ({"dtype": "F32", "shape": [-5, 3], "data_offsets": [0, 4]}, "no valid dtype and shape"),
    ({"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}, "no valid dtype and shape"),
    # (Once "more than any model has": the tensor's bytes are now checked against its shape first.)
    ({"dtype": "F32", "shape": [2**30, 2**30], "data_offsets": [0, 4]},
     r"tensor 't' \(F32, shape \[1073741824, 1073741824\]\) needs 4611686018427387904 bytes, but its data_offsets "
     "hold 4"),
])
def test_a_malformed_weights_header_is_named(root, entry, message):
    model_dir = write_model_dir(root / "bad")
    header = json.dumps({"t": entry}).encode()
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ModelDirError, match=message):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


@pytest.mark.parametrize("header, message", [
    ({"t": {"dtype": "F99", "shape": [1], "data_offsets": [0, 4]}},
     "tensor 't' has dtype 'F99', which is none of safetensors' (BOOL, F4, "),
    ({"t": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}},
     "tensor 't' (F32, shape [2]) needs 8 bytes, but its data_offsets hold 4; the file is corrupt"),
    ({"t": {"dtype": "F4", "shape": [3], "data_offsets": [0, 4]}},
     "tensor 't' (F4, shape [3]) needs 1.5 bytes, but its data_offsets hold 4; the file is corrupt"),
    ({"a": {"dtype": "F16", "shape": [1], "data_offsets": [2, 4]}},
     "tensor 'a''s data starts at byte 2 of the data section, where the data before it ends at byte 0"),
    ({"a": {"dtype": "F16", "shape": [2], "data_offsets": [0, 4]}, "b": {"dtype": "F16", "shape": [1],
                                                                         "data_offsets": [2, 4]}},
     "tensor 'b''s data starts at byte 2 of the data section, where the data before it ends at byte 4"),
    ({"__metadata__": {"format": 5}, "t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
     "the header's __metadata__ is not an object of strings; the file is corrupt"),
], ids=["unknown dtype", "shape larger than its bytes", "half a byte", "a gap before", "overlapping tensors",
        "metadata not strings"])
def test_a_header_the_loader_refuses_is_refused_naming_the_tensor(root, header, message):
    """Audit: each was registered (and described by jaxengine inspect, which reads headers with the same reader):
    the safetensors library refuses such a file, so the first run or chat on the model failed at load."""
    from safetensors import SafetensorError, safe_open

    model_dir = write_model_dir(root / "bad")
    weights = model_dir / "model.safetensors"
    raw = json.dumps(header).encode()
    weights.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4)
    with pytest.raises(SafetensorError):  # as generate, train and the chat load it
        with safe_open(str(weights), framework="numpy"):
            pass
    with pytest.raises(ModelDirError) as refused:
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    assert str(refused.value).startswith(f"{weights}: {message}")


def test_a_weights_path_that_is_a_directory_is_named_not_a_500(root):
    """Audit: an IsADirectoryError out of the registration (a server error on the Base models page)."""
    model_dir = write_model_dir(root / "bad")
    (model_dir / "model.safetensors").unlink()
    (model_dir / "model.safetensors").mkdir()
    with pytest.raises(ModelDirError) as refused:
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    assert str(refused.value) == (f"{model_dir / 'model.safetensors'}: not a file (a directory?); copy or convert the "
                                  "weights again")


@pytest.mark.parametrize("weight_map", [[1, 2], {"a": 5}])
def test_a_malformed_shard_index_is_named(root, weight_map):
    model_dir = write_model_dir(root / "bad", shards=2)
    (model_dir / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelDirError, match="'weight_map' must map each tensor name to its file name"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


@pytest.mark.parametrize("name", ["config.json", "model.safetensors", "tokenizer.json"])
def test_a_file_linked_outside_the_root_is_refused(root, tmp_path, name):
    """Only the directory was checked: a config.json linked to a file outside the root was registered and
    shown on the model's page."""
    model_dir = write_model_dir(root / "linked")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / name).write_bytes((model_dir / name).read_bytes())
    (model_dir / name).unlink()
    (model_dir / name).symlink_to(outside / name)
    with pytest.raises(ModelDirError, match=f"{name} links to .*outside the models root"):
        read_model_facts(resolve_model_dir("linked", models_root=root, project_slug="alpha"), models_root=root, project_slug="alpha")


def test_a_shard_index_linked_outside_the_root_is_refused_in_those_words(root, tmp_path):
    """The index's read, widened to every error json.loads raises (a ValueError), must not take the link's refusal
    (a ModelDirError, a ValueError too) for a JSON problem."""
    model_dir = write_model_dir(root / "linked", shards=2)
    outside = tmp_path / "outside"
    outside.mkdir()
    index = model_dir / "model.safetensors.index.json"
    (outside / index.name).write_bytes(index.read_bytes())
    index.unlink()
    index.symlink_to(outside / index.name)
    with pytest.raises(ModelDirError) as excinfo:
        read_model_facts(resolve_model_dir("linked", models_root=root, project_slug="alpha"), models_root=root,
                         project_slug="alpha")
    assert str(excinfo.value) == (f"{index} links to {outside / index.name}, outside the models root {root.resolve()}; "
                                  "copy the file into the model's directory")


def test_a_config_too_large_to_be_one_is_refused(root):
    model_dir = write_model_dir(root / "big")
    _with_config(model_dir, padding="x" * (1024 * 1024))
    with pytest.raises(ModelDirError, match="a config.json is a few KB"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


def test_a_truncated_weights_file_is_refused(root):
    """A half-copied model.safetensors keeps an intact header: it was registered, and its first run or chat
    failed at load ("incomplete metadata, file not fully covered")."""
    model_dir = write_model_dir(root / "half")
    weights = model_dir / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(whole[:-100])
    with pytest.raises(ModelDirError, match=r"model.safetensors: the header places tensor data up to byte \d+ .* "
                                            "the file is truncated"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    weights.write_bytes(whole + b"\0" * 16)
    with pytest.raises(ModelDirError, match="16 bytes after the last tensor's data"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


@pytest.mark.parametrize("offsets", [None, [4], [8, 4], ["0", "4"], [-4, 0]])
def test_malformed_data_offsets_are_named(root, offsets):
    model_dir = write_model_dir(root / "bad")
    header = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": offsets}}).encode()
    (model_dir / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * 4)
    with pytest.raises(ModelDirError, match="tensor 't' has no valid data_offsets"):
        read_model_facts(model_dir, models_root=root, project_slug="alpha")


def test_a_weights_link_to_itself_is_named_not_a_500(root):
    """A model.safetensors linked to itself (a link loop) was an OSError out of the registration: a server error."""
    model_dir = write_model_dir(root / "bad")
    (model_dir / "model.safetensors").unlink()
    (model_dir / "model.safetensors").symlink_to(model_dir / "model.safetensors")
    with pytest.raises(ModelDirError) as refused:
        read_model_facts(model_dir, models_root=root, project_slug="alpha")
    assert str(model_dir / "model.safetensors") in str(refused.value)


def test_a_model_directory_link_to_itself_is_named_not_a_500(root):
    (root / "loop").symlink_to(root / "loop")
    with pytest.raises(ModelDirError) as refused:
        resolve_model_dir("loop", models_root=root, project_slug="alpha")
    assert str(refused.value) == f"{root / 'loop'}: a link that leads back to itself; replace it with the file or directory"
