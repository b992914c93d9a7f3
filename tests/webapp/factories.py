"""Builders for web-side test data, shared by unit, integration and browser tests.

``make_team()`` gives the cast every access test needs: a project with an owner, a
teammate (member), a viewer, and an outsider who belongs to another project only.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser

from webapp.core.submissions import TOKEN_FIELD
from webapp.projects import services as project_services
from webapp.projects.models import Project, Role

PASSWORD = "correct-horse-battery"


def make_user(username: str, *, password: str = PASSWORD) -> AbstractBaseUser:
    """An active user with ``password``."""
    return get_user_model().objects.create_user(username=username, password=password)


@dataclass(frozen=True, kw_only=True)
class Team:
    project: Project
    owner: AbstractBaseUser
    teammate: AbstractBaseUser
    viewer: AbstractBaseUser
    outsider: AbstractBaseUser
    outsider_project: Project


def make_team(*, slug: str = "alpha") -> Team:
    """Project ``slug`` with owner, teammate (member) and viewer; the outsider owns
    a separate project so that they are a real, logged-in user of the site."""
    owner = make_user(f"{slug}-owner")
    teammate = make_user(f"{slug}-teammate")
    viewer = make_user(f"{slug}-viewer")
    outsider = make_user(f"{slug}-outsider")
    project = project_services.project_create(name=f"Project {slug}", slug=slug, owner=owner)
    project_services.membership_add(project=project, user=teammate, role=Role.MEMBER)
    project_services.membership_add(project=project, user=viewer, role=Role.VIEWER)
    outsider_project = project_services.project_create(
        name="Elsewhere", slug=f"{slug}-elsewhere", owner=outsider
    )
    return Team(
        project=project,
        owner=owner,
        teammate=teammate,
        viewer=viewer,
        outsider=outsider,
        outsider_project=outsider_project,
    )


# The tensors of write_model_dir's config.json: what registration and the loader expect of it.
TINY_LLAMA_SHAPES = {
    "model.embed_tokens.weight": (64, 8), "model.norm.weight": (8,),
    "model.layers.0.input_layernorm.weight": (8,), "model.layers.0.post_attention_layernorm.weight": (8,),
    **{f"model.layers.0.self_attn.{name}_proj.weight": (8, 8) for name in "qkvo"},
    "model.layers.0.mlp.gate_proj.weight": (16, 8), "model.layers.0.mlp.up_proj.weight": (16, 8),
    "model.layers.0.mlp.down_proj.weight": (8, 16),
}
TINY_LLAMA_PARAMETERS = 64 * 8 + 8 + 2 * 8 + 4 * 8 * 8 + 3 * 16 * 8  # 1176


def write_model_dir(
    model_dir, *, shapes: dict[str, tuple[int, ...]] | None = None, shards: int = 1, tokenizer: str = "tokenizer.json",
    tokenizer_ids: int | None = None,
):
    """Write a minimal Hugging Face-format directory: config.json (a one-layer Llama of width 8 over a vocabulary
    of 64, tied embeddings), float32 zero tensors of ``shapes`` (default: those that config describes,
    ``TINY_LLAMA_PARAMETERS`` of them) split over ``shards`` safetensors files (with an index when sharded) and an
    empty tokenizer file named ``tokenizer`` — or, with ``tokenizer_ids``, a word-level ``tokenizer.json`` of that
    many ids, the last one an added special token. Returns the directory."""
    import json

    import numpy as np
    from safetensors.numpy import save_file

    shapes = shapes or TINY_LLAMA_SHAPES
    model_dir.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "max_position_embeddings": 256,
        "vocab_size": 64,
        "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
        "tie_word_embeddings": True,
    }
    (model_dir / "config.json").write_text(json.dumps(config))
    names = sorted(shapes)
    if shards == 1:
        save_file({name: np.zeros(shapes[name], np.float32) for name in names}, str(model_dir / "model.safetensors"))
    else:
        weight_map = {}
        for shard in range(shards):
            file_name = f"model-{shard + 1:05d}-of-{shards:05d}.safetensors"
            part = names[shard::shards]
            save_file({name: np.zeros(shapes[name], np.float32) for name in part}, str(model_dir / file_name))
            weight_map.update({name: file_name for name in part})
        (model_dir / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (model_dir / tokenizer).write_text("{}" if tokenizer_ids is None else json.dumps(_word_level_tokenizer(tokenizer_ids)))
    return model_dir


def _word_level_tokenizer(ids: int) -> dict:
    words = {f"w{index}": index for index in range(ids - 1)}
    end = {"id": ids - 1, "content": "<|end|>", "single_word": False, "lstrip": False, "rstrip": False,
           "normalized": False, "special": True}
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [end], "normalizer": None,
            "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
            "model": {"type": "WordLevel", "vocab": words, "unk_token": "w0"}}


QWEN3_LIKE = ("{% for m in messages %}{{ m.content }}{% endfor %}{% if add_generation_prompt %}assistant"
              "{% if enable_thinking is defined and enable_thinking is false %} <think></think>{% endif %}{% endif %}")


def thinking_model_dir(path: Path, *, own_variables: dict | None = None) -> Path:
    """A model directory whose chat template reads enable_thinking (its weights are not read here), with its own
    template variables (chat_template_kwargs.json) where given."""
    path.mkdir()
    (path / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN3_LIKE}))
    if own_variables is not None:
        (path / "chat_template_kwargs.json").write_text(json.dumps(own_variables))
    return path


def make_base_model(project: Project, *, name: str = "tiny", path: str = "/models/tiny",
                    user: AbstractBaseUser | None = None):
    """A registered base model row, registered by ``user`` (the directory itself is not read)."""
    from webapp.basemodels.models import BaseModel

    return BaseModel.objects.create(
        project=project, name=name, path=path, architecture="LlamaForCausalLM", parameter_count=1,
        tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1, registered_by=user,
    )


def make_ready_version(project: Project, *, name: str = "chats", kind: str = "sft", rows: list[dict] | None = None,
                       user: AbstractBaseUser | None = None):
    """A ready dataset version of ``kind`` whose JSONL file (``rows``) is in place under DATA_ROOT."""
    import json

    from webapp.datasets.models import Dataset, DatasetVersion, VersionStatus

    rows = rows if rows is not None else [{"prompt": f"q{i}", "completion": f"answer {i}"} for i in range(8)]
    dataset, _ = Dataset.objects.get_or_create(project=project, name=name, defaults={"kind": kind, "created_by": user})
    number = dataset.versions.count() + 1
    Dataset.objects.filter(pk=dataset.pk).update(last_version_number=number)  # as the upload service keeps it
    version = DatasetVersion(dataset=dataset, number=number, original_filename=f"{name}.jsonl", format="jsonl",
                             size_bytes=0, status=VersionStatus.READY, row_count=len(rows), created_by=user)
    version.file_path = f"datasets/{dataset.public_id}/{version.public_id}.jsonl"
    version.absolute_path.parent.mkdir(parents=True, exist_ok=True)
    version.absolute_path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    version.size_bytes = version.absolute_path.stat().st_size
    version.save()
    return version


def form_tokens(page: str, *, after: str = "") -> list[str]:
    """The one-time tokens (``{% submission_token %}``) of the forms in ``page``, from the first
    ``after`` on (a form's id or action, to pick one form of several)."""
    return re.findall(rf'name="{TOKEN_FIELD}" value="([^"]+)"', page[page.index(after):])


def form_token(page: str, *, after: str = "") -> str:
    """The token of the first form in ``page`` from ``after`` on (see ``form_tokens``)."""
    return form_tokens(page, after=after)[0]


def du_bytes(*paths: Path) -> int:
    """What ``du`` itself counts on disk for ``paths`` together (a hard-linked file once across them), in bytes: the
    reference the Storage figures are checked against."""
    import subprocess

    output = subprocess.run(["du", "-s", "--block-size=1", "--total", *map(str, paths)], check=True,
                            capture_output=True, text=True).stdout
    return int(output.splitlines()[-1].split()[0])


def write_bytes(path: Path, size: int) -> Path:
    """A file of ``size`` random bytes at ``path`` (its folders made)."""
    import os

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(size))
    return path
