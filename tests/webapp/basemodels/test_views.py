"""Base model registry: service and pages."""
import pytest
from django.core.exceptions import ValidationError

from tests.webapp.factories import TINY_LLAMA_PARAMETERS, TINY_LLAMA_SHAPES, write_model_dir
from webapp.basemodels.models import BaseModel
from webapp.basemodels.services import basemodel_register


@pytest.fixture
def models_root(settings, tmp_path):
    settings.MODELS_ROOT = tmp_path / "models"
    settings.MODELS_ROOT.mkdir()
    write_model_dir(settings.MODELS_ROOT / "tiny")
    return settings.MODELS_ROOT


@pytest.fixture
def registered(team, models_root):
    return basemodel_register(project=team.project, name="tiny", path="tiny", user=team.teammate)


def test_register_records_the_facts(registered, models_root):
    assert registered.public_id.startswith("bm_")
    assert registered.path == str((models_root / "tiny").resolve())
    assert (registered.parameter_count, registered.context_length, registered.vocab_size) == (
        TINY_LLAMA_PARAMETERS, 256, 64)


def test_register_rejects_duplicates(registered, team):
    with pytest.raises(ValidationError) as excinfo:
        basemodel_register(project=team.project, name="tiny", path="tiny", user=team.owner)
    assert "name" in excinfo.value.message_dict
    with pytest.raises(ValidationError, match="already registered"):
        basemodel_register(project=team.project, name="other", path="tiny", user=team.owner)


def test_names_differing_only_in_letter_case_are_one_name(registered, team, models_root):
    """QA: "Demo" and "demo" could both be registered in one project, and then not be told apart in lists."""
    write_model_dir(models_root / "second")
    with pytest.raises(ValidationError) as excinfo:
        basemodel_register(project=team.project, name=" TINY ", path="second", user=team.owner)
    assert excinfo.value.message_dict["name"] == [
        "alpha already has a base model named 'tiny'; names that differ only in letter case are the same name"]
    assert basemodel_register(project=team.outsider_project, name="TINY", path="tiny", user=team.outsider).name == "TINY"


def test_the_database_refuses_a_name_differing_only_in_letter_case(registered, team):
    from django.db import IntegrityError, transaction

    with pytest.raises(IntegrityError), transaction.atomic():
        BaseModel.objects.create(project=team.project, name="Tiny", path="/elsewhere", architecture="x",
                                 parameter_count=1, tokenizer_type="x", dtype="x", size_bytes=1)


@pytest.mark.parametrize("first, second", [("Ärger", "ärger"), ("ΣΟΦΙΑ", "σοφια")])
def test_names_differing_only_in_letter_case_are_one_name_in_every_script(team, models_root, first, second):
    """QA: on SQLite, LOWER() folds ASCII letters only, so "Ärger" and "ärger" could both be registered."""
    from django.db import IntegrityError, transaction

    basemodel_register(project=team.project, name=first, path="tiny", user=team.owner)
    write_model_dir(models_root / "second")
    with pytest.raises(ValidationError) as excinfo:
        basemodel_register(project=team.project, name=second, path="second", user=team.owner)
    assert excinfo.value.message_dict["name"] == [
        f"alpha already has a base model named {first!r}; names that differ only in letter case are the same name"]
    with pytest.raises(IntegrityError), transaction.atomic():
        BaseModel.objects.create(project=team.project, name=second, path="/elsewhere", architecture="x",
                                 parameter_count=1, tokenizer_type="x", dtype="x", size_bytes=1)


class TestList:
    url = "/p/alpha/models/"

    def test_it_works(self, registered, team, client_for):
        response = client_for(team.viewer).get(self.url)
        assert response.status_code == 200
        assert b"LlamaForCausalLM" in response.content
        assert registered.public_id.encode() in response.content
        assert b"Register a model" not in response.content
        assert b"Register a model" in client_for(team.teammate).get(self.url).content

    def test_it_requires_access(self, team, client, client_for):
        assert client_for(team.outsider).get(self.url).status_code == 404
        assert client.get(self.url).status_code == 302


class TestRegister:
    url = "/p/alpha/models/register/"

    def test_it_works(self, team, models_root, client_for):
        client = client_for(team.teammate)
        page = client.get(self.url)
        assert page.status_code == 200
        assert b"<code>tiny</code>" in page.content, "candidate directories are suggested"
        assert ("Only the config, the safetensors headers and the tokenizer (for its number of ids) are read, "
                "never the weights.") in page.content.decode()
        response = client.post(self.url, {"name": "tiny", "path": "tiny"})
        assert response.status_code == 302
        base_model = BaseModel.objects.get(project=team.project)
        assert response["Location"] == f"/p/alpha/models/{base_model.public_id}/"

    def test_found_directories_fill_in_the_path_and_say_which_are_registered(self, registered, team, models_root,
                                                                              client_for):
        """They were bare names: each had to be typed into Path, and one already registered here was listed
        like the others until registering it was refused."""
        write_model_dir(models_root / "family" / "small model")
        client = client_for(team.teammate)
        page = client.get(self.url).content.decode()
        assert "<code>tiny</code> <span class=\"muted\">registered here as <bdi>tiny</bdi></span>" in page
        assert '<a href="?path=family/small%20model" title="Fill in the path"><code>family/small model</code></a>' in page
        chosen = client.get(self.url + "?path=family/small%20model").content.decode()
        assert 'name="path" value="family/small model"' in chosen

    def test_a_link_out_of_the_models_root_is_not_suggested(self, team, models_root, tmp_path, client_for):
        """QA: a link under the root to a model outside it was listed, so the page told that the place it
        points to holds a config.json, and filling it in was then refused as outside the root."""
        write_model_dir(tmp_path / "outside" / "model")
        (models_root / "escape").symlink_to(tmp_path / "outside")
        (models_root / "inside").symlink_to(models_root / "tiny")
        page = client_for(team.teammate).get(self.url).content.decode()
        assert "<code>tiny</code>" in page and "<code>inside</code>" in page
        assert "escape/model" not in page

    def test_it_requires_access(self, team, models_root, client, client_for):
        assert client_for(team.outsider).post(self.url, {"name": "t", "path": "tiny"}).status_code == 404
        assert client_for(team.viewer).post(self.url, {"name": "t", "path": "tiny"}).status_code == 403
        assert client_for(team.viewer).get(self.url).status_code == 403
        assert client.post(self.url, {"name": "t", "path": "tiny"}).status_code == 302
        assert not BaseModel.objects.exists()

    @pytest.mark.parametrize(
        ("path", "message"),
        [
            ("../tiny", b"contains &#x27;..&#x27;"),
            ("/etc", b"not a directory under the models root"),
            ("nowhere", b"does not exist"),
        ],
    )
    def test_it_rejects_bad_paths(self, team, models_root, client_for, path, message):
        response = client_for(team.owner).post(self.url, {"name": "x", "path": path})
        assert response.status_code == 400
        assert message in response.content
        assert not BaseModel.objects.exists()

    @pytest.mark.parametrize("config_fields, tensors, message", [
        ({"num_hidden_layers": 1_000_000}, {}, "config.json: num_hidden_layers is 1000000, but the weights hold 1 layers "
         "(the last, layer 0, in {weights}); set num_hidden_layers to 1, or register the weights this config.json was "
         "written for"),
        ({"hidden_size": 4096}, {}, "config.json does not describe the weights: &#x27;model.embed_tokens.weight&#x27; in "
         "{weights} has shape [64, 8] in its header, [64, 4096] from config.json (hidden_size = 4096); "),
        ({}, {"model.layers.0.mlp.up_proj.weight": None}, "config.json does not describe the weights: "
         "&#x27;model.layers.0.mlp.up_proj.weight&#x27; of shape [16, 8] is missing from {weights}; correct the "
         "config.json fields named, or register the weights this config.json was written for"),
        ({}, {"model.layers.1.input_layernorm.weight": (8,)}, "config.json: num_hidden_layers is 1, but "
         "&#x27;model.layers.1.input_layernorm.weight&#x27; in {weights} is layer 1: the weights hold 2 layers; set "
         "num_hidden_layers to 2, or register the weights this config.json was written for"),
    ], ids=["a million layers", "hidden_size far off", "a layer tensor missing", "a layer beyond the count"])
    def test_it_rejects_a_config_that_does_not_describe_the_weights(self, team, models_root, client_for,
                                                                   config_fields, tensors, message):
        """QA: these were registered (the count came from the headers), and the first run or chat built the model
        config.json describes: a million layers got the worker killed for memory."""
        import json

        shapes = {name: shape for name, shape in {**TINY_LLAMA_SHAPES, **tensors}.items() if shape is not None}
        model_dir = write_model_dir(models_root / "odd", shapes=shapes)
        config = json.loads((model_dir / "config.json").read_text())
        (model_dir / "config.json").write_text(json.dumps({**config, **config_fields}))
        response = client_for(team.owner).post(self.url, {"name": "odd", "path": "odd"})
        assert response.status_code == 400
        weights = models_root.resolve() / "odd" / "model.safetensors"
        assert message.format(weights=weights) in response.content.decode()
        assert not BaseModel.objects.exists()

    def test_it_rejects_an_eos_token_the_vocabulary_lacks(self, team, models_root, client_for):
        """QA: it was registered; its tokenizer gave the token a new id the weights have no row for, and the chat's
        answers never ended on it."""
        import json

        model_dir = write_model_dir(models_root / "odd", tokenizer_ids=50)  # w0..w48 and <|end|>
        (model_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
        response = client_for(team.owner).post(self.url, {"name": "odd", "path": "odd"})
        assert response.status_code == 400
        folder = models_root.resolve() / "odd"
        assert (f"{folder / 'tokenizer_config.json'}: eos_token &#x27;&lt;/s&gt;&#x27; is not in the vocabulary "
                f"({folder / 'tokenizer.json'}) nor among its added tokens") in response.content.decode()
        assert "or remove the field, then register it" in response.content.decode()
        assert not BaseModel.objects.exists()
        (model_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|end|>"}))
        assert client_for(team.owner).post(self.url, {"name": "odd", "path": "odd"}).status_code == 302

    def test_it_rejects_symlink_escape(self, team, models_root, tmp_path, client_for):
        outside = write_model_dir(tmp_path / "outside")
        (models_root / "sneaky").symlink_to(outside, target_is_directory=True)
        response = client_for(team.owner).post(self.url, {"name": "x", "path": "sneaky"})
        assert response.status_code == 400
        assert b"symlinks there may not point outside" in response.content


class TestDetail:
    def test_it_works(self, registered, team, client_for):
        response = client_for(team.viewer).get(f"/p/alpha/models/{registered.public_id}/")
        assert response.status_code == 200
        assert f"({TINY_LLAMA_PARAMETERS})".encode() in response.content and b"tokenizer.json" in response.content

    def test_it_shows_a_padded_vocabulary_with_both_sizes(self, team, models_root, client_for):
        write_model_dir(models_root / "padded", tokenizer_ids=50)
        model = basemodel_register(project=team.project, name="padded", path="padded", user=team.teammate)
        page = client_for(team.viewer).get(f"/p/alpha/models/{model.public_id}/").content.decode()
        assert ("<dt>Vocabulary</dt><dd>64 embedding rows, 50 tokenizer ids "
                '<span class="muted">(14 rows of padding)</span></dd>') in page
        write_model_dir(models_root / "one-over", tokenizer_ids=63)  # it said "(1 rows of padding)"
        model = basemodel_register(project=team.project, name="one over", path="one-over", user=team.teammate)
        page = client_for(team.viewer).get(f"/p/alpha/models/{model.public_id}/").content.decode()
        assert '<span class="muted">(1 row of padding)</span>' in page

    def test_it_shows_one_size_when_the_embedding_fits_the_tokenizer(self, team, models_root, client_for):
        write_model_dir(models_root / "exact", tokenizer_ids=64)
        model = basemodel_register(project=team.project, name="exact", path="exact", user=team.teammate)
        page = client_for(team.viewer).get(f"/p/alpha/models/{model.public_id}/").content.decode()
        assert "<dt>Vocabulary</dt><dd>64</dd>" in page

    def test_it_warns_of_tokenizer_ids_the_embedding_has_no_row_for(self, team, models_root, client_for):
        write_model_dir(models_root / "short", tokenizer_ids=70)
        model = basemodel_register(project=team.project, name="short", path="short", user=team.teammate)
        page = client_for(team.viewer).get(f"/p/alpha/models/{model.public_id}/").content.decode()
        assert ("<dt>Vocabulary</dt><dd>64 embedding rows, 70 tokenizer ids "
                '<span class="error">(ids 64 to 69 have no embedding row)</span></dd>') in page

    def test_it_shows_config_json_as_json(self, registered, team, client_for):
        """The config.json card showed Python's repr of it: 'True', 'None' and single quotes."""
        BaseModel.objects.filter(pk=registered.pk).update(config={
            "architectures": ["LlamaForCausalLM"], "tie_word_embeddings": True, "rope_scaling": None,
            "note": "<script>x</script>"})
        page = client_for(team.viewer).get(f"/p/alpha/models/{registered.public_id}/").content.decode()
        assert ('<pre>{\n  &quot;architectures&quot;: [\n    &quot;LlamaForCausalLM&quot;\n  ],\n'
                '  &quot;note&quot;: &quot;&lt;script&gt;x&lt;/script&gt;&quot;,\n  &quot;rope_scaling&quot;: null,\n'
                '  &quot;tie_word_embeddings&quot;: true\n}</pre>') in page  # sorted, as transformers writes it

    def test_it_shows_the_licence_its_exports_will_carry_escaped(self, registered, team, models_root, client_for):
        """A team should see a base model's licence before training from it: the exports carry it on."""
        folder = models_root / "tiny"
        (folder / "README.md").write_text("---\nlicense: llama3.2\nlicense_name: <script>alert(1)</script>\n"
                                          "license_link: javascript:alert('<b>')\n---\n# Llama\n")
        (folder / "LICENSE").write_text("terms")
        (folder / "USE_POLICY <i>.md").write_text("policy")
        (folder / "NOTICE").write_bytes(b"x" * (2 << 20))
        page = client_for(team.viewer).get(f"/p/alpha/models/{registered.public_id}/").content.decode()
        licence = page[page.index('<section class="card" id="licence">'):]
        licence = licence[:licence.index("</section>")]
        assert ("<dt>Licence</dt><dd><code>llama3.2</code> "
                '<span class="muted">(&lt;script&gt;alert(1)&lt;/script&gt;)</span></dd>') in licence
        assert "<dt>Terms</dt><dd><code>javascript:alert(&#x27;&lt;b&gt;&#x27;)</code></dd>" in licence
        assert "<dt>Files</dt><dd><code>LICENSE</code>, <code>USE_POLICY &lt;i&gt;.md</code></dd>" in licence
        assert "with the line “Built with Llama” its licence asks" in licence
        assert "<code>NOTICE</code> (2.0\xa0MB) is over 1.0\xa0MB: exports do not carry it" in licence
        assert "<script>" not in licence and "<a " not in licence and "<i>" not in licence

    def test_it_says_when_the_folder_states_no_licence(self, registered, team, client_for):
        page = client_for(team.viewer).get(f"/p/alpha/models/{registered.public_id}/").content.decode()
        assert ("Its folder states no licence (no <code>license:</code> in its README.md, no LICENSE, NOTICE or terms "
                "file): check its terms before sharing a model trained from it.") in page
        assert "Built with Llama" not in page

    def test_it_requires_access(self, registered, team, client, client_for):
        url = f"/p/alpha/models/{registered.public_id}/"
        assert client_for(team.outsider).get(url).status_code == 404
        # The id alone is not enough: looked up under another project it does not exist.
        assert client_for(team.outsider).get(f"/p/alpha-elsewhere/models/{registered.public_id}/").status_code == 404
        assert client.get(url).status_code == 302

    def test_it_rejects_unknown_id(self, registered, team, client_for):
        assert client_for(team.owner).get("/p/alpha/models/bm_nope/").status_code == 404


def test_a_base_models_page_leads_to_a_run_and_a_chat_from_it(registered, team, client_for):
    """QA: a base model's page listed its facts and serving copy, and went nowhere: a run from it was
    started on the launch page by finding it again in the model list, a chat likewise."""
    page = client_for(team.teammate).get(f"/p/{team.project.slug}/models/{registered.public_id}/").content.decode()
    launch = f'href="/p/{team.project.slug}/runs/new/?model={registered.public_id}"'
    chat = f'href="/p/{team.project.slug}/chat/?model={registered.public_id}#new-conversation"'
    assert launch in page and chat in page
    form = client_for(team.teammate).get(f"/p/{team.project.slug}/runs/new/?model={registered.public_id}")
    positions = registered.config["max_position_embeddings"]  # its context, the launch form's limit of max_seq_len
    assert f'<option value="{registered.public_id}" data-positions="{positions}" selected>' in form.content.decode()
    unknown = client_for(team.teammate).get(f"/p/{team.project.slug}/runs/new/?model=bm_nothing")
    assert unknown.status_code == 200 and "bm_nothing" not in unknown.content.decode()
    viewer_page = client_for(team.viewer).get(f"/p/{team.project.slug}/models/{registered.public_id}/").content.decode()
    assert launch not in viewer_page and chat not in viewer_page  # a viewer may neither launch nor chat


def test_the_list_shows_a_page_of_models_however_many_the_project_has(team, client_for):
    """The base model list showed every model of the project on one page: 100 took 20 ms of template a load
    (bench/pages_at_scale.py), and it grew with each. It shows 50 a page, by name, with the pages' links, in as many
    queries for 60 models as for 10."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext
    from django.urls import reverse

    from webapp.core.name_case import name_key

    client = client_for(team.viewer)
    list_url = reverse("basemodels:list", args=[team.project.slug])
    counts = []
    for total in (10, 60):
        BaseModel.objects.bulk_create([
            BaseModel(project=team.project, name=f"model {index:02d}", name_key=name_key(f"model {index:02d}"),
                      path=f"/models/{index}", architecture="LlamaForCausalLM", parameter_count=1,
                      tokenizer_type="tokenizer.json", dtype="float32", size_bytes=1, registered_by=team.owner)
            for index in range(BaseModel.objects.filter(project=team.project).count(), total)])
        with CaptureQueriesContext(connection) as queries:
            page = client.get(list_url).content.decode()
        counts.append(len(queries))
    assert page.count('<tr>\n      <td><a href="/p/') == 50 and "model 49" in page and "model 50" not in page
    assert "Page 1 of 2 · 60 in all" in page
    second = client.get(f"{list_url}?page=2").content.decode()
    assert second.count('<tr>\n      <td><a href="/p/') == 10 and "model 50" in second and "model 59" in second
    assert counts[0] == counts[1]
