"""Tokenizers loaded from a model directory, encoding and decoding exactly as ``transformers`` does.

Design note. Two backends, chosen by the files present (``tokenizer.json`` wins, as in ``transformers``):

* ``tokenizer.json`` → the ``tokenizers`` library, used as the file describes it. Added tokens listed in
  ``tokenizer_config.json`` that the file lacks are added on load; ``encode(add_special_tokens=True)``
  uses the file's post-processor (``transformers`` ignores ``add_bos_token`` when a ``tokenizer.json``
  exists, so do we).
* ``tokenizer.model`` → the ``sentencepiece`` library. ``transformers`` converts such a model to a
  ``tokenizers`` pipeline whose rules differ from ``SentencePieceProcessor.encode`` in a few places, and
  prompts must be the same ids whichever library made them, so this backend applies those rules itself:
  the text is split on added/special tokens first (special tokens inside text become their ids); the
  "▁" dummy prefix goes only before a chunk that does not already start with a space, and — unless
  ``legacy: true`` — only before the chunk at the very start of the text; decoding replaces "▁" with
  spaces, joins byte-fallback pieces into UTF-8 (U+FFFD per byte when invalid) and strips one leading
  space. ``add_special_tokens=True`` adds BOS/EOS per ``add_bos_token``/``add_eos_token`` (default off).

Special tokens come from ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ``pad_token``,
``unk_token``, ``added_tokens_decoder``, ``extra_special_tokens``/``additional_special_tokens``), from
``special_tokens_map.json`` (only when the config has no ``added_tokens_decoder``, as in
``transformers``), and ``generation_config.json`` adds its ``eos_token_id`` (an int or a list) to
``eos_ids`` and fills ``bos_id``/``pad_id`` when the tokenizer config names none. A named token the vocabulary
lacks is added as a new one, as transformers adds it, except ``eos_token``: its new id would be one the model's
weights never learned to write, so answers would never end on it, and it is refused (``UnknownEosTokenError``).

This module does not import jax, so the web process may use it.
"""
from __future__ import annotations

import abc
import dataclasses
import functools
import json
import re
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from jaxengine import chat_template as chat_template_lib
from jaxengine.json_files import read_json_object

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_MAP_FILE = "special_tokens_map.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_JSON_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"

# The named special-token attributes of transformers, in its order; all of them reach chat templates.
NAMED_SPECIAL_TOKENS = chat_template_lib.SPECIAL_TOKEN_VARIABLES

_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_SPACE_MARK = "\u2581"  # SentencePiece's "▁", which stands for a space inside pieces


class TokenizerError(ValueError):
    """A tokenizer directory cannot be loaded; the message names the file and what to fix."""


class UnknownEosTokenError(TokenizerError):
    """The named ``eos_token`` is not in the vocabulary. transformers adds it as a new token, whose id the model's
    embedding, fixed by its weights, has no trained row for: a generation would never stop on it."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AddedToken:
    """A token matched on the raw text before the model's own segmentation (``added_tokens_decoder``)."""

    id: int
    content: str
    special: bool = True
    lstrip: bool = False
    rstrip: bool = False
    single_word: bool = False
    normalized: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenizerSettings:
    """Everything read from the JSON files next to the vocabulary; ids are resolved later by the backend."""

    named_tokens: Mapping[str, str]  # e.g. {"bos_token": "<s>", "eos_token": "</s>"}; unset names absent
    extra_special_tokens: tuple[str, ...]
    added_tokens: tuple[AddedToken, ...]
    add_bos_token: bool
    add_eos_token: bool
    legacy: bool
    add_prefix_space: bool | None
    chat_template: str | None
    # chat_template_kwargs.json (``chat_template.CHAT_TEMPLATE_KWARGS_FILE``): variables every chat is rendered with.
    template_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    generation_eos_ids: tuple[int, ...]
    generation_bos_id: int | None
    generation_pad_id: int | None
    # The file each of ``named_tokens`` was read from (tokenizer_config.json or special_tokens_map.json).
    named_token_files: Mapping[str, str] = dataclasses.field(default_factory=dict)


def chat_template_file(model_dir: str | Path, settings: TokenizerSettings) -> Path | None:
    """The file a model directory's own chat template was read from (``read_chat_template``'s precedence), for an
    error to name; None when it has none and the default is used."""
    if settings.chat_template is None:
        return None
    template_path = Path(model_dir) / chat_template_lib.CHAT_TEMPLATE_FILE
    return template_path if template_path.is_file() else Path(model_dir) / TOKENIZER_CONFIG_FILE


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    return read_json_object(path, error=TokenizerError, advice="fix or remove the file")


def _token_content(value: Any, *, path: Path, field: str) -> str | None:
    """A special token as written in a config: a string, or an AddedToken dict with ``content``."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise TokenizerError(f"{path}: field {field!r} = {value!r}: expected a string or an object with a 'content' "
                         "string")


def _extra_special_tokens(config: Mapping[str, Any], *, path: Path) -> list[str]:
    """The special tokens beyond the named ones, from the first of ``extra_special_tokens`` (a list, or the
    model-specific form ``{"image_token": "<img>", ...}``) and ``additional_special_tokens`` that is set."""
    field = next((key for key in ("extra_special_tokens", "additional_special_tokens") if config.get(key)), None)
    if field is None:
        return []
    tokens = config[field]
    if isinstance(tokens, Mapping):
        tokens = list(tokens.values())
    if not isinstance(tokens, list):  # a string was read a character a token, a number was a TypeError
        raise TokenizerError(f"{path}: field {field!r} = {tokens!r}: expected a list of special tokens")
    return [_token_content(token, path=path, field=f"{field}[{index}]") for index, token in enumerate(tokens)]


def _added_tokens(config: Mapping[str, Any], *, path: Path) -> list[AddedToken]:
    """``added_tokens_decoder``: token id (a string of digits) -> the token's content and flags."""
    decoder = config.get("added_tokens_decoder") or {}
    if not isinstance(decoder, Mapping):
        raise TokenizerError(f"{path}: field 'added_tokens_decoder' = {decoder!r}: expected an object of token ids "
                             '(strings of digits) to tokens, e.g. {"0": {"content": "<unk>"}}')
    added_tokens = []
    for token_id, token in decoder.items():
        if not (token_id.isascii() and token_id.isdecimal()):
            raise TokenizerError(f"{path}: added_tokens_decoder: {token_id!r} is not a token id; the keys are token "
                                 'ids as strings of digits, e.g. "0"')
        if not isinstance(token, Mapping) or not isinstance(token.get("content"), str):
            raise TokenizerError(f"{path}: added_tokens_decoder[{token_id!r}] = {token!r}: expected an object with a "
                                 "'content' string")
        added_tokens.append(AddedToken(
            id=int(token_id), content=token["content"], special=bool(token.get("special", False)),
            lstrip=bool(token.get("lstrip", False)), rstrip=bool(token.get("rstrip", False)),
            single_word=bool(token.get("single_word", False)), normalized=bool(token.get("normalized", False)),
        ))
    return added_tokens


def _int_list(value: Any, *, path: Path, field: str) -> tuple[int, ...]:
    if value is None:
        return ()
    values = value if isinstance(value, list) else [value]
    if not all(isinstance(item, int) and not isinstance(item, bool) for item in values):
        raise TokenizerError(f"{path}: field {field!r} = {value!r}: expected an integer or a list of integers")
    return tuple(values)


def _read_template_kwargs(model_dir: Path, *, run_spec_variables: bool) -> dict[str, Any]:
    path = model_dir / chat_template_lib.CHAT_TEMPLATE_KWARGS_FILE
    if not path.is_file():
        return _run_template_kwargs(model_dir) if run_spec_variables else {}
    variables = _read_json(path)
    for name, value in variables.items():
        if problem := chat_template_lib.template_variable_problem(name, value):
            raise TokenizerError(f"{path}: {name}: {problem}")
    return variables


# A run directory's spec and exports (``jaxengine.job``): <run>/spec.yaml beside <run>/export and <run>/export-step-N,
# each with its quantized serving copy inside (``quantized/``).
_RUN_SPEC_FILE = "spec.yaml"
_EXPORT_DIR = re.compile(r"export(-step-\d+)?")
_QUANTIZED_DIR = "quantized"


def _run_template_kwargs(model_dir: Path) -> dict[str, Any]:
    """The ``data.chat_template_kwargs`` of the run whose export (or serving copy of one) ``model_dir`` is, for an
    export without ``chat_template_kwargs.json``: one written before exports kept them was served without the
    variables its run trained with (Qwen3 trained with thinking off answered with thinking on). {} for a directory
    that is no run's export, and for a run that set none."""
    export_dir = model_dir.parent if model_dir.name == _QUANTIZED_DIR else model_dir
    spec_path = export_dir.parent / _RUN_SPEC_FILE
    if not _EXPORT_DIR.fullmatch(export_dir.name) or not spec_path.is_file():
        return {}
    from jaxengine.spec import load_yaml  # here: the spec module (its schemas, dataset formats) takes most of a second

    try:
        spec = load_yaml(spec_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        raise TokenizerError(f"{spec_path}: cannot be read for the chat template variables of its run's export "
                             f"{model_dir}: {error}") from None
    data = spec.get("data") if isinstance(spec, Mapping) else None
    variables = data.get("chat_template_kwargs") if isinstance(data, Mapping) else None
    if not isinstance(variables, Mapping):
        return {}
    for name, value in variables.items():
        if problem := chat_template_lib.template_variable_problem(name, value):
            raise TokenizerError(f"{spec_path}: data.chat_template_kwargs.{name}: {problem}")
    return dict(variables)


def read_tokenizer_settings(model_dir: str | Path, *, run_spec_variables: bool = True) -> TokenizerSettings:
    """Reads special tokens, flags, chat template and generation ids from the JSON files in ``model_dir``.

    ``run_spec_variables=False``: an export without ``chat_template_kwargs.json`` has no template variables of its
    own rather than its run's ``spec.yaml``'s (``_run_template_kwargs``), for a caller that has the run's variables
    from their record (the web's Run row: a job's ``data.run_spec_template_kwargs``)."""
    model_dir = Path(model_dir)
    config_path = model_dir / TOKENIZER_CONFIG_FILE
    config = _read_json(config_path)
    named = {key: _token_content(config.get(key), path=config_path, field=key) for key in NAMED_SPECIAL_TOKENS}
    named_files = dict.fromkeys(named, TOKENIZER_CONFIG_FILE)
    extra = _extra_special_tokens(config, path=config_path)
    if "added_tokens_decoder" not in config:
        map_path = model_dir / SPECIAL_TOKENS_MAP_FILE
        special_tokens_map = _read_json(map_path)
        for key in NAMED_SPECIAL_TOKENS:
            if key in special_tokens_map:
                named[key] = _token_content(special_tokens_map[key], path=map_path, field=key)
                named_files[key] = SPECIAL_TOKENS_MAP_FILE
        extra = extra or _extra_special_tokens(special_tokens_map, path=map_path)
    added_tokens = _added_tokens(config, path=config_path)
    generation_path = model_dir / GENERATION_CONFIG_FILE
    generation = _read_json(generation_path)
    generation_bos = _int_list(generation.get("bos_token_id"), path=generation_path, field="bos_token_id")
    generation_pad = _int_list(generation.get("pad_token_id"), path=generation_path, field="pad_token_id")
    return TokenizerSettings(
        named_tokens={key: value for key, value in named.items() if value is not None},
        extra_special_tokens=tuple(extra),
        added_tokens=tuple(sorted(added_tokens, key=lambda token: token.id)),
        add_bos_token=bool(config.get("add_bos_token", False)),
        add_eos_token=bool(config.get("add_eos_token", False)),
        legacy=bool(config.get("legacy", False)),
        add_prefix_space=config.get("add_prefix_space"),
        chat_template=chat_template_lib.read_chat_template(model_dir, config),
        template_kwargs=_read_template_kwargs(model_dir, run_spec_variables=run_spec_variables),
        generation_eos_ids=_int_list(generation.get("eos_token_id"), path=generation_path, field="eos_token_id"),
        generation_bos_id=generation_bos[0] if generation_bos else None,
        generation_pad_id=generation_pad[0] if generation_pad else None,
        named_token_files={key: named_files[key] for key, value in named.items() if value is not None},
    )


class Tokenizer(abc.ABC):
    """A model's tokenizer: text ↔ ids, special-token ids, chat template, and saving.

    ``encode`` treats special tokens written inside the text as those tokens (as ``transformers`` does);
    ``decode`` drops special tokens unless ``skip_special_tokens=False``.
    """

    kind: str  # "sentencepiece" | "tokenizers", shown by ``jaxengine inspect``

    def __init__(self, *, model_dir: Path, settings: TokenizerSettings) -> None:
        self.model_dir = model_dir
        self.settings = settings
        # The variables every chat is rendered with unless a call gives its own: the model's file's, then a
        # job's data.chat_template_kwargs over them (``jaxengine.job.build_job_model``); ``save`` writes them.
        self.template_kwargs: dict[str, Any] = dict(settings.template_kwargs)

    @abc.abstractmethod
    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``; with ``add_special_tokens`` also BOS/EOS as the tokenizer is configured."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of ``ids``."""

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (vocabulary piece or added token), or None when there is none."""

    def token_bytes(self, token_id: int) -> bytes:
        """The UTF-8 bytes one token stands for, special tokens included (OpenAI's ``logprobs`` ``bytes``): part
        of a character where a character spans several tokens. Subclasses read their byte tokens; this fallback
        decodes the token alone."""
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (``len(AutoTokenizer)``)."""

    @property
    @abc.abstractmethod
    def special_ids(self) -> frozenset[int]:
        """Ids that ``decode(skip_special_tokens=True)`` drops."""

    def _refuse_an_eos_token_outside(self, vocabulary_file: str, *, in_vocabulary: Callable[[str], bool]) -> None:
        """``UnknownEosTokenError`` when the named ``eos_token`` is neither in the vocabulary (``in_vocabulary``) nor
        among the added tokens the configs declare: it was made up a new id, and the answers never ended on it."""
        content = self.settings.named_tokens.get("eos_token")
        if content is None or in_vocabulary(content) or any(
                token.content == content for token in self.settings.added_tokens):
            return
        source = self.model_dir / self.settings.named_token_files.get("eos_token", TOKENIZER_CONFIG_FILE)
        raise UnknownEosTokenError(
            f"{source}: eos_token {content!r} is not in the vocabulary ({self.model_dir / vocabulary_file}) nor among "
            "its added tokens, so it would get a new id the model's weights have no trained row for, and generation "
            "would never stop on it; set eos_token to the token this model ends its answers with (one its vocabulary "
            "holds, as its chat template writes it after each turn), or remove the field")

    def _named_id(self, name: str) -> int | None:
        content = self.settings.named_tokens.get(name)
        return None if content is None else self.token_to_id(content)

    @property
    def bos_id(self) -> int | None:
        """BOS id from the tokenizer config, else from generation_config.json, else None."""
        named = self._named_id("bos_token")
        return named if named is not None else self.settings.generation_bos_id

    @property
    def eos_ids(self) -> list[int]:
        """The config's ``eos_token`` id followed by generation_config.json's ``eos_token_id``(s), no repeats."""
        ids = [self._named_id("eos_token"), *self.settings.generation_eos_ids]
        return list(dict.fromkeys(token_id for token_id in ids if token_id is not None))

    @property
    def pad_id(self) -> int | None:
        """PAD id from the tokenizer config, else from generation_config.json, else None."""
        named = self._named_id("pad_token")
        return named if named is not None else self.settings.generation_pad_id

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens that are set, as chat templates see them (``bos_token`` etc.)."""
        return dict(self.settings.named_tokens)

    @property
    def chat_template(self) -> str:
        """The model's chat template, or the documented ChatML-like default when it has none."""
        return self.settings.chat_template or chat_template_lib.DEFAULT_CHAT_TEMPLATE

    @property
    def chat_template_file(self) -> Path | None:
        """The file the model's own chat template was read from (``read_chat_template``'s precedence), or
        None when it has none and the default is used."""
        return chat_template_file(self.model_dir, self.settings)

    def apply_chat_template(
        self, messages: Sequence[Mapping[str, Any]], *, add_generation_prompt: bool = False,
        generation_spans: list[tuple[int, int]] | None = None, **template_kwargs: Any
    ) -> str:
        """Renders ``messages`` with the chat template exactly as ``transformers`` does (text, not ids), with
        ``template_kwargs`` over this tokenizer's own (``self.template_kwargs``); ``generation_spans`` as
        ``chat_template.render_chat_template``'s.

        A ChatTemplateError of the model's own template names the file holding it: 'chat template: ...'
        alone did not say which of the two that may hold one to fix."""
        try:
            return chat_template_lib.render_chat_template(
                self.chat_template, messages, add_generation_prompt=add_generation_prompt,
                generation_spans=generation_spans, **{**self.special_tokens_map, **self.template_kwargs, **template_kwargs},
            )
        except chat_template_lib.ChatTemplateError as error:
            if self.chat_template_file is None or not messages:  # the default's, or no conversation at all
                raise
            raise chat_template_lib.ChatTemplateError(f"{self.chat_template_file}: {error}") from None

    def save(self, out_dir: str | Path) -> None:
        """Copies the tokenizer files this tokenizer was loaded from into ``out_dir``, and writes its
        ``template_kwargs`` to ``chat_template_kwargs.json`` (none when it has none).

        ``generation_config.json`` is copied only when ``out_dir`` has none, since a model saver may
        already have written the model's own.
        """
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        names = (TOKENIZER_JSON_FILE, SENTENCEPIECE_FILE, TOKENIZER_CONFIG_FILE, SPECIAL_TOKENS_MAP_FILE,
                 chat_template_lib.CHAT_TEMPLATE_FILE)
        for name in names:
            source = self.model_dir / name
            if source.is_file() and source.resolve() != (out_dir / name).resolve():
                shutil.copyfile(source, out_dir / name)
        kwargs_path = out_dir / chat_template_lib.CHAT_TEMPLATE_KWARGS_FILE
        if self.template_kwargs:
            kwargs_path.write_text(json.dumps(self.template_kwargs, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        elif kwargs_path.resolve() != (self.model_dir / chat_template_lib.CHAT_TEMPLATE_KWARGS_FILE).resolve():
            kwargs_path.unlink(missing_ok=True)
        generation = self.model_dir / GENERATION_CONFIG_FILE
        if generation.is_file() and not (out_dir / GENERATION_CONFIG_FILE).exists():
            shutil.copyfile(generation, out_dir / GENERATION_CONFIG_FILE)


class HuggingFaceTokenizer(Tokenizer):
    """``tokenizer.json`` through the ``tokenizers`` library."""

    kind = "tokenizers"

    def __init__(self, *, model_dir: Path, settings: TokenizerSettings) -> None:
        import tokenizers

        super().__init__(model_dir=model_dir, settings=settings)
        path = model_dir / TOKENIZER_JSON_FILE
        try:
            self._tokenizer = tokenizers.Tokenizer.from_file(str(path))
        except Exception as error:  # the Rust side raises a bare Exception with its parse message
            raise TokenizerError(f"{path}: cannot be read by the tokenizers library: {error}") from None
        # Prompts are padded and truncated by the sampler and the data pipeline, never here.
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        self._refuse_an_eos_token_outside(TOKENIZER_JSON_FILE,
                                          in_vocabulary=lambda content: self._tokenizer.token_to_id(content) is not None)
        known = set(self._tokenizer.get_added_tokens_decoder().values())
        known_contents = {token.content for token in known}
        missing = [
            tokenizers.AddedToken(token.content, single_word=token.single_word, lstrip=token.lstrip,
                                  rstrip=token.rstrip, normalized=token.normalized, special=token.special)
            for token in settings.added_tokens if token.content not in known_contents
        ]
        named = [*settings.named_tokens.values(), *settings.extra_special_tokens]
        missing_contents = {token.content for token in missing}
        missing += [tokenizers.AddedToken(content, special=True, normalized=False)
                    for content in dict.fromkeys(named) if content not in known_contents | missing_contents]
        if missing:
            self._tokenizer.add_tokens(missing)
        self._special_ids = frozenset(
            token_id for token_id, token in self._tokenizer.get_added_tokens_decoder().items() if token.special)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        import tokenizers

        token = self._tokenizer.id_to_token(int(token_id))
        if token is None:
            return b""
        alphabet = _byte_level_alphabet()
        if (isinstance(self._tokenizer.decoder, tokenizers.decoders.ByteLevel)
                and token_id not in self._tokenizer.get_added_tokens_decoder() and all(c in alphabet for c in token)):
            return bytes(alphabet[c] for c in token)
        return super().token_bytes(token_id)

    @property
    def vocab_size(self) -> int:
        return self._tokenizer.get_vocab_size(with_added_tokens=True)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids


class SentencePieceTokenizer(Tokenizer):
    """``tokenizer.model`` through the ``sentencepiece`` library, with transformers' splitting rules."""

    kind = "sentencepiece"

    def __init__(self, *, model_dir: Path, settings: TokenizerSettings) -> None:
        import sentencepiece
        from sentencepiece import sentencepiece_model_pb2

        super().__init__(model_dir=model_dir, settings=settings)
        path = model_dir / SENTENCEPIECE_FILE
        proto = sentencepiece_model_pb2.ModelProto()
        try:
            proto.ParseFromString(path.read_bytes())
        except Exception as error:  # protobuf's DecodeError, raised for any file that is not a model
            raise TokenizerError(f"{path}: not a SentencePiece model ({error})") from None
        add_prefix_space = settings.add_prefix_space
        self._add_prefix_space = proto.normalizer_spec.add_dummy_prefix if add_prefix_space is None else add_prefix_space
        # The dummy prefix is applied here per chunk (see the module note), so the processor must not add it.
        proto.normalizer_spec.add_dummy_prefix = False
        self._processor = sentencepiece.SentencePieceProcessor(model_proto=proto.SerializeToString())
        self._piece_count = piece_count = self._processor.get_piece_size()

        self._refuse_an_eos_token_outside(SENTENCEPIECE_FILE,
                                          in_vocabulary=lambda content: self._piece_id(content) is not None)
        self._added_by_content: dict[str, AddedToken] = {token.content: token for token in settings.added_tokens}
        next_id = max([piece_count - 1, *(token.id for token in settings.added_tokens)]) + 1
        for content in dict.fromkeys([*settings.named_tokens.values(), *settings.extra_special_tokens]):
            if content in self._added_by_content:
                continue
            piece_id = self._piece_id(content)
            if piece_id is None:
                piece_id, next_id = next_id, next_id + 1
            self._added_by_content[content] = AddedToken(id=piece_id, content=content, special=True)
        self._added_by_id = {token.id: token for token in self._added_by_content.values()}
        self._vocab_size = max([piece_count - 1, *self._added_by_id]) + 1
        self._special_ids = frozenset(token.id for token in self._added_by_content.values() if token.special)
        contents = sorted(self._added_by_content, key=len, reverse=True)  # longest first: leftmost-longest match
        self._added_pattern = re.compile("|".join(map(re.escape, contents))) if contents else None

    def _piece_id(self, piece: str) -> int | None:
        piece_id = self._processor.piece_to_id(piece)
        return piece_id if self._processor.id_to_piece(piece_id) == piece else None

    def _split_on_added_tokens(self, text: str) -> list[tuple[str, int | None, int]]:
        """[(chunk text, added token id or None, start offset in text)] covering ``text`` in order."""
        pieces: list[tuple[str, int | None, int]] = []
        position = 0
        for match in (self._added_pattern.finditer(text) if self._added_pattern else ()):
            token = self._added_by_content[match.group()]
            start, end = match.span()
            if start < position:  # overlaps whitespace an rstrip token already took
                continue
            if token.single_word and ((start > 0 and text[start - 1].isalnum()) or
                                      (end < len(text) and text[end].isalnum())):
                continue
            chunk_end = len(text[position:start].rstrip()) + position if token.lstrip else start
            pieces.append((text[position:chunk_end], None, position))
            pieces.append((match.group(), token.id, start))
            position = end + (len(text[end:]) - len(text[end:].lstrip()) if token.rstrip else 0)
        pieces.append((text[position:], None, position))
        return [piece for piece in pieces if piece[1] is not None or piece[0]]

    def _encode_chunk(self, chunk: str, *, at_start: bool) -> list[int]:
        prepend = self._add_prefix_space and (at_start or self.settings.legacy) and not chunk.startswith((" ", _SPACE_MARK))
        return self._processor.encode(" " + chunk if prepend else chunk)

    def encode(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        ids: list[int] = []
        for chunk, added_id, start in self._split_on_added_tokens(text):
            ids.extend([added_id] if added_id is not None else self._encode_chunk(chunk, at_start=start == 0))
        if add_special_tokens:
            if self.settings.add_bos_token and self.bos_id is not None:
                ids.insert(0, self.bos_id)
            if self.settings.add_eos_token and self._named_id("eos_token") is not None:
                ids.append(self._named_id("eos_token"))
        return ids

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        parts: list[str] = []
        pending_bytes = bytearray()
        byte_count = 0

        def flush_bytes() -> None:
            nonlocal byte_count
            if byte_count:
                try:
                    parts.append(pending_bytes.decode("utf-8"))
                except UnicodeDecodeError:
                    parts.append("\ufffd" * byte_count)
                pending_bytes.clear()
                byte_count = 0

        for token_id in ids:
            token_id = int(token_id)
            if skip_special_tokens and token_id in self._special_ids:
                continue
            added = self._added_by_id.get(token_id)
            if added is None and not 0 <= token_id < self._piece_count:
                # A model's embedding often has more rows than its tokenizer has pieces (padded to a
                # multiple of 64 or 128: Gemma 3, Qwen 2.5); such an id has no text, and transformers
                # (like the `tokenizers` library) decodes it as nothing rather than failing the answer.
                continue
            piece = added.content if added is not None else self._processor.id_to_piece(token_id)
            byte_match = _BYTE_PIECE.match(piece) if added is None else None
            if byte_match:
                pending_bytes.append(int(byte_match.group(1), 16))
                byte_count += 1
                continue
            flush_bytes()
            parts.append(piece.replace(_SPACE_MARK, " "))
        flush_bytes()
        text = "".join(parts)
        return text[1:] if self._add_prefix_space and text.startswith(" ") else text

    def token_bytes(self, token_id: int) -> bytes:
        added = self._added_by_id.get(int(token_id))
        if added is not None:
            return added.content.encode("utf-8")
        if not 0 <= token_id < self._piece_count:
            return b""
        piece = self._processor.id_to_piece(int(token_id))
        byte_match = _BYTE_PIECE.match(piece)
        return bytes([int(byte_match.group(1), 16)]) if byte_match else piece.replace(_SPACE_MARK, " ").encode("utf-8")

    def token_to_id(self, token: str) -> int | None:
        added = self._added_by_content.get(token)
        return added.id if added is not None else self._piece_id(token)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special_ids


@functools.cache
def _byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's character for each byte (GPT-2's ``bytes_to_unicode``), inverted: character -> byte."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    characters, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            characters[chr(byte)] = byte
        else:
            characters[chr(256 + extra)] = byte
            extra += 1
    return characters


def load_tokenizer(model_dir: str | Path, *, run_spec_variables: bool = True) -> Tokenizer:
    """Loads the tokenizer of a Hugging Face-style model directory (``tokenizer.json`` or ``tokenizer.model``);
    ``run_spec_variables`` as ``read_tokenizer_settings`` takes it."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise TokenizerError(f"{model_dir}: no such directory")
    settings = read_tokenizer_settings(model_dir, run_spec_variables=run_spec_variables)
    if (model_dir / TOKENIZER_JSON_FILE).is_file():
        return HuggingFaceTokenizer(model_dir=model_dir, settings=settings)
    if (model_dir / SENTENCEPIECE_FILE).is_file():
        return SentencePieceTokenizer(model_dir=model_dir, settings=settings)
    raise TokenizerError(
        f"{model_dir}: no tokenizer found; expected {TOKENIZER_JSON_FILE} (Hugging Face tokenizers) or "
        f"{SENTENCEPIECE_FILE} (SentencePiece) next to config.json")


class IncrementalDecoder:
    """Turns a stream of generated ids into text deltas whose concatenation is ``decode(all ids)``.

    Decoding one id at a time is wrong for byte-fallback and byte-level tokenizers (a character may span
    several ids) and for SentencePiece (the first piece loses its leading space). So each step decodes a
    short window that starts at an already-emitted token and emits only the new suffix, holding text
    back while it ends in an incomplete character (U+FFFD).
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []
        self._prefix_offset = 0  # window start
        self._read_offset = 0  # ids before this are emitted

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(ids, skip_special_tokens=self._skip_special_tokens)

    def push(self, token_id: int) -> str:
        """Adds one id; returns the text it completes ("" while a character is still incomplete)."""
        self._ids.append(int(token_id))
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return new_text[len(prefix_text):]
        return ""

    def flush(self) -> str:
        """Text still held back at the end of the stream (an incomplete character decodes to U+FFFD)."""
        prefix_text = self._decode(self._ids[self._prefix_offset:self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset:])
        self._prefix_offset = self._read_offset = len(self._ids)
        return new_text[len(prefix_text):]
