"""Tokenizer parity with transformers' AutoTokenizer, on locally trained tiny tokenizers."""
import json

import pytest
import transformers

from jaxengine.tokenizer import IncrementalDecoder, TokenizerError, load_tokenizer
from tests import factories

# Unicode, CJK, emoji, whitespace runs, newlines, tabs, special tokens inside text (glued to words,
# at the start, at the end, repeated), characters outside the training data, and empty strings.
TEXTS = [
    "Hello world!",
    "the quick brown fox jumps over the lazy dog.",
    "  leading spaces",
    "trailing spaces   ",
    " ",
    "",
    "a\nb\n\nc\n",
    "tab\there\t\tand\ttabs",
    "multiple     spaces   between",
    "你好世界, 日本語のテスト and 한국어",
    "emoji 🙂🚀 ✨ mixed😀text",
    "café naïve résumé über straße",
    "decomposed: cafe\u0301 and e\u0301",
    "½ ﬁ ℕ ∑ unseen: Ωμέγα Привет עברית",
    "numbers 12345 and 3.14159, 2024-11-30",
    "code: def f(x):\n    return {'a': [1, 2]}\n",
    "<s>inside</s> text",
    "x <s> y </s> z",
    "<s><s></s>",
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhey<|eot_id|>",
    "glued<|im_end|>tokens<|endoftext|>end",
]


def _tokenizer_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizers")
    return {
        "sentencepiece": factories.build_sentencepiece_tokenizer_dir(root / "sentencepiece"),
        "qwen": factories.build_bpe_tokenizer_dir(root / "qwen", style="qwen"),
        "llama3": factories.build_bpe_tokenizer_dir(root / "llama3", style="llama3"),
    }


@pytest.fixture(scope="module")
def tokenizer_dirs(tmp_path_factory):
    return _tokenizer_dirs(tmp_path_factory)


@pytest.fixture(scope="module", params=["sentencepiece", "qwen", "llama3"])
def pair(request, tokenizer_dirs):
    model_dir = tokenizer_dirs[request.param]
    return request.param, load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))


def test_backend_follows_the_files(pair):
    name, ours, _ = pair
    assert ours.kind == ("sentencepiece" if name == "sentencepiece" else "tokenizers")


@pytest.mark.parametrize("text", TEXTS)
def test_encode_matches_transformers(pair, text):
    _, ours, reference = pair
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)
    assert ours.encode(text, add_special_tokens=True) == reference.encode(text, add_special_tokens=True)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_matches_transformers(pair, text):
    _, ours, reference = pair
    ids = reference.encode(text, add_special_tokens=True)
    assert ours.decode(ids) == reference.decode(ids, skip_special_tokens=True)
    assert ours.decode(ids, skip_special_tokens=False) == reference.decode(ids, skip_special_tokens=False)


def test_decode_of_invalid_byte_sequences_matches_transformers(pair):
    _, ours, reference = pair
    ids = reference.encode("🙂 ünï 你好", add_special_tokens=False)
    for cut in range(1, len(ids)):  # every prefix and suffix, most of which split a character
        assert ours.decode(ids[:cut]) == reference.decode(ids[:cut], skip_special_tokens=True)
        assert ours.decode(ids[cut:]) == reference.decode(ids[cut:], skip_special_tokens=True)


def test_ids_beyond_the_vocabulary_decode_as_nothing_like_transformers(pair):
    # Model embeddings are often padded past the tokenizer (Gemma 3: 262,208 rows for 262,144 pieces);
    # a sampled padding id must not fail the answer.
    _, ours, reference = pair
    ids = reference.encode("Hello world", add_special_tokens=False)
    beyond = [ours.vocab_size, ours.vocab_size + 63]
    mixed = ids[:1] + beyond + ids[1:]
    assert ours.decode(mixed) == reference.decode(mixed, skip_special_tokens=True) == ours.decode(ids)
    assert ours.decode(mixed, skip_special_tokens=False) == reference.decode(mixed, skip_special_tokens=False)
    decoder = IncrementalDecoder(ours)
    assert "".join(decoder.push(token_id) for token_id in mixed) + decoder.flush() == ours.decode(ids)


def test_special_ids_match_transformers(pair):
    _, ours, reference = pair
    assert ours.vocab_size == len(reference)
    assert ours.bos_id == reference.bos_token_id
    assert ours.special_tokens_map == reference.special_tokens_map
    assert ours.eos_ids[0] == reference.eos_token_id
    if reference.pad_token_id is not None:
        assert ours.pad_id == reference.pad_token_id


def test_special_ids_include_generation_config(tokenizer_dirs):
    sentencepiece = load_tokenizer(tokenizer_dirs["sentencepiece"])
    assert sentencepiece.bos_id == 1
    assert sentencepiece.eos_ids == [2, 481]  # </s>, then generation_config's [2, <end_of_turn>]
    assert sentencepiece.pad_id == 0  # the config sets pad_token null; generation_config gives 0
    assert sentencepiece.token_to_id("<end_of_turn>") == 481

    qwen = load_tokenizer(tokenizer_dirs["qwen"])
    im_end, endoftext = qwen.token_to_id("<|im_end|>"), qwen.token_to_id("<|endoftext|>")
    assert qwen.bos_id is None
    assert qwen.eos_ids == [im_end, endoftext]
    assert qwen.pad_id == endoftext

    llama3 = load_tokenizer(tokenizer_dirs["llama3"])
    assert llama3.eos_ids == [llama3.token_to_id("<|eot_id|>"), llama3.token_to_id("<|end_of_text|>")]
    assert llama3.bos_id == llama3.token_to_id("<|begin_of_text|>")


def test_legacy_sentencepiece_prefixes_every_chunk_like_transformers(tmp_path):
    model_dir = factories.build_sentencepiece_tokenizer_dir(tmp_path)
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["legacy"] = True
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))
    for text in TEXTS:
        assert ours.encode(text) == reference.encode(text, add_special_tokens=False), text
    assert ours.encode("a<s>b") != load_tokenizer(factories.build_sentencepiece_tokenizer_dir(tmp_path / "new")).encode("a<s>b")


def test_special_tokens_map_json_is_read_when_config_has_no_added_tokens(tmp_path):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, style="qwen")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    del config["added_tokens_decoder"], config["pad_token"]
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (model_dir / "special_tokens_map.json").write_text(json.dumps({"pad_token": {"content": "<|im_start|>"}}))
    (model_dir / "generation_config.json").unlink()
    ours, reference = load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))
    assert ours.pad_id == reference.pad_token_id == ours.token_to_id("<|im_start|>")
    assert ours.eos_ids == [ours.token_to_id("<|im_end|>")]


@pytest.mark.parametrize("backend, source", [("sentencepiece", "tokenizer_config.json"), ("qwen", "tokenizer_config.json"),
                                             ("qwen", "special_tokens_map.json")])
def test_an_eos_token_the_vocabulary_lacks_is_refused_naming_file_field_and_token(tmp_path, backend, source):
    """QA: transformers adds such a token with a new id, past the ids the model's weights were trained on; the
    answers never ended on it, and nothing said why."""
    model_dir = (factories.build_sentencepiece_tokenizer_dir(tmp_path / "tok") if backend == "sentencepiece"
                 else factories.build_bpe_tokenizer_dir(tmp_path / "tok", style="qwen"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    if source == "special_tokens_map.json":  # read only where the config has no added_tokens_decoder
        del config["added_tokens_decoder"], config["eos_token"]
        (model_dir / source).write_text(json.dumps({"eos_token": {"content": "<|eot|>"}}))
    else:
        config["eos_token"] = "<|eot|>"
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    reference = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    assert reference.eos_token_id == len(reference) - 1, "transformers makes up an id for it"
    vocabulary = "tokenizer.model" if backend == "sentencepiece" else "tokenizer.json"
    with pytest.raises(TokenizerError) as error:
        load_tokenizer(model_dir)
    assert str(error.value) == (
        f"{model_dir / source}: eos_token '<|eot|>' is not in the vocabulary ({model_dir / vocabulary}) nor among its "
        "added tokens, so it would get a new id the model's weights have no trained row for, and generation would "
        "never stop on it; set eos_token to the token this model ends its answers with (one its vocabulary holds, as "
        "its chat template writes it after each turn), or remove the field")


def test_added_token_missing_from_tokenizer_json_is_added_like_transformers(tmp_path):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path, style="qwen")
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"]["403"] = {"content": "<tool_call>", "special": False, "lstrip": False,
                                             "rstrip": False, "normalized": False, "single_word": False}
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    ours, reference = load_tokenizer(model_dir), transformers.AutoTokenizer.from_pretrained(str(model_dir))
    text = "call<tool_call>now<|im_end|>"
    assert ours.encode(text) == reference.encode(text, add_special_tokens=False)
    assert ours.token_to_id("<tool_call>") == 403
    assert ours.decode(ours.encode(text)) == reference.decode(reference.encode(text), skip_special_tokens=True)


@pytest.mark.parametrize("name", ["sentencepiece", "qwen"])
def test_incremental_decoder_deltas_add_up_to_decode(tokenizer_dirs, name):
    tokenizer = load_tokenizer(tokenizer_dirs[name])
    for text in TEXTS:
        ids = tokenizer.encode(text)
        decoder = IncrementalDecoder(tokenizer)
        deltas = [decoder.push(token_id) for token_id in ids]
        deltas.append(decoder.flush())
        assert "".join(deltas) == tokenizer.decode(ids), text
        assert not any("\ufffd" in delta for delta in deltas[:-1]) or "\ufffd" in tokenizer.decode(ids)


def test_save_writes_a_loadable_copy(tokenizer_dirs, tmp_path):
    for name, model_dir in tokenizer_dirs.items():
        out_dir = tmp_path / name
        load_tokenizer(model_dir).save(out_dir)
        copy, original = load_tokenizer(out_dir), load_tokenizer(model_dir)
        assert copy.encode(TEXTS[-1]) == original.encode(TEXTS[-1])
        assert copy.eos_ids == original.eos_ids
        assert copy.chat_template == original.chat_template


def test_it_rejects_a_directory_without_tokenizer(tmp_path):
    with pytest.raises(TokenizerError, match="no tokenizer found; expected tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="no such directory"):
        load_tokenizer(tmp_path / "missing")


def test_it_rejects_bad_json_with_file_and_line(tmp_path):
    model_dir = factories.build_bpe_tokenizer_dir(tmp_path)
    (model_dir / "generation_config.json").write_text('{\n "eos_token_id": [1,\n}')
    with pytest.raises(TokenizerError, match=r"generation_config.json: line 3: not valid JSON"):
        load_tokenizer(model_dir)


@pytest.mark.parametrize("backend, add_bos_token, gets_bos", [
    ("sentencepiece", True, True), ("sentencepiece", False, False), ("sentencepiece", None, False),
    ("llama3", True, True), ("llama3", False, True), ("llama3", None, True),
    ("qwen", True, False),
], ids=lambda value: "absent" if value is None else str(value))
def test_add_special_tokens_gives_bos_as_transformers_does(tmp_path, backend, add_bos_token, gets_bos):
    """What README says of ``jaxengine generate`` without --chat: with only a tokenizer.model, BOS comes from
    tokenizer_config.json's add_bos_token (absent: none, as the demo model's false); with a tokenizer.json,
    its post-processor decides and add_bos_token is ignored — as transformers encodes."""
    model_dir = (factories.build_sentencepiece_tokenizer_dir(tmp_path) if backend == "sentencepiece"
                 else factories.build_bpe_tokenizer_dir(tmp_path, style=backend))
    config_path = model_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("add_bos_token", None)
    if add_bos_token is not None:
        config["add_bos_token"] = add_bos_token
    config_path.write_text(json.dumps(config))
    ours = load_tokenizer(model_dir)
    reference = transformers.AutoTokenizer.from_pretrained(str(model_dir))
    ids = ours.encode("Hello world", add_special_tokens=True)
    assert ids == reference("Hello world")["input_ids"]
    assert (ids[0] == ours.bos_id) is gets_bos


@pytest.mark.parametrize("text", TEXTS)
def test_token_bytes_spell_the_text_token_by_token(pair, text):
    """Each token's bytes (what OpenAI's logprobs give as ``bytes``), a byte-level or byte-fallback token's its raw
    byte, part of a character: joined they are the UTF-8 of the ids' decoding (the text as the tokenizer normalized
    it), special tokens as written; SentencePiece's first token holds the space it puts before the text, which its
    decoding drops."""
    name, ours, _ = pair
    ids = ours.encode(text)
    joined = b"".join(ours.token_bytes(token_id) for token_id in ids)
    decoded = ours.decode(ids, skip_special_tokens=False).encode()
    assert joined in (decoded, b" " + decoded) if name == "sentencepiece" else joined == decoded
