"""data.chat_template_kwargs end to end in the engine: the spec checks them, the launch warns of ones the
template never reads, the job renders every chat with them, the export keeps them (chat_template_kwargs.json)
for whoever loads it, and `jaxengine generate --template-var` sets them for one prompt."""
import json
import shutil
from pathlib import Path

import pytest
import yaml

from jaxengine.cli import main
from jaxengine.data.pipeline import encode_prompt
from jaxengine.job import build_job_model, run_job
from jaxengine.spec import SpecError, parse_spec, spec_warnings
from jaxengine.tokenizer import load_tokenizer
from tests import factories

# Qwen3's switch, on a template small enough to read: thinking off closes an empty think block.
THINKING_TEMPLATE = ("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}assistant:"
                     "{% if enable_thinking is defined and enable_thinking is false %} <think></think>{% endif %}"
                     "{% endif %}")


def _spec(model, output_dir, data, **data_keys):
    return {"task": "sft", "model": str(model), "output_dir": str(output_dir),
            "data": {"train": str(data), "max_seq_len": 64, **data_keys},
            "train": {"max_steps": 1, "batch_size": 2, "eval_samples": 0}}


QWEN3_TEMPLATE = (Path(__file__).parent / "tokenizer" / "real_templates" / "qwen3.jinja").read_text(encoding="utf-8")


@pytest.fixture
def thinking_model(demo_dir, tmp_path):
    """The demo model with Qwen3's own template, whose thinking-off prompt stays a prefix of the trained turn."""
    model = tmp_path / "model"
    shutil.copytree(demo_dir / "model", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = QWEN3_TEMPLATE
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize(("variables", "problem"), [
    ({"enable_thinking": [False]}, "data.chat_template_kwargs.enable_thinking: [False] is a list; give a JSON scalar"),
    ({"persona": {"name": "x"}}, "data.chat_template_kwargs.persona: {'name': 'x'} is a mapping; give a JSON scalar"),
    ({"messages": "x"}, "data.chat_template_kwargs.messages: 'messages' is set by the renderer itself"),
    # The renderer's own argument (the {% generation %} spans of the loss mask): as a variable it clashed with it.
    ({"generation_spans": 1}, "data.chat_template_kwargs.generation_spans: 'generation_spans' is set by the renderer"),
    ({"two words": 1}, "data.chat_template_kwargs: 'two words' is not a variable name a template can read"),
])
def test_it_rejects_a_template_variable_that_is_no_scalar_or_not_settable(tmp_path, variables, problem):
    with pytest.raises(SpecError) as raised:
        parse_spec(_spec("m", tmp_path, "t.jsonl", chat_template_kwargs=variables))
    assert len(raised.value.problems) == 1 and raised.value.problems[0].startswith(problem)


def test_scalars_of_every_json_kind_are_accepted(tmp_path):
    variables = {"enable_thinking": False, "date_string": "01 Jan 2030", "effort": 2, "temperature_hint": 0.5,
                 "persona": None}
    assert parse_spec(_spec("m", tmp_path, "t.jsonl", chat_template_kwargs=variables)).data.chat_template_kwargs == variables


def test_a_variable_the_template_never_reads_is_warned_of_naming_those_it_reads(tmp_path):
    spec = parse_spec(_spec("m", tmp_path, "t.jsonl", chat_template_kwargs={"enable_thinkng": False}))
    assert spec_warnings(spec, chat_template=THINKING_TEMPLATE) == [
        "data.chat_template_kwargs: the model's chat template never reads enable_thinkng, so it does nothing; "
        "the variables it reads are enable_thinking"]
    read = parse_spec(_spec("m", tmp_path, "t.jsonl", chat_template_kwargs={"enable_thinking": False}))
    assert spec_warnings(read, chat_template=THINKING_TEMPLATE) == []


def test_cli_train_warns_of_an_unread_variable_before_the_run(thinking_model, tmp_path, capsys):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_spec(thinking_model, tmp_path / "run", tmp_path / "missing.jsonl",
                                         chat_template_kwargs={"enable_thinkng": False})))
    assert main(["train", str(path), "--no-progress"]) == 2  # the missing file, after the warning
    assert capsys.readouterr().err.splitlines()[0] == (
        f"{path}: warning: data.chat_template_kwargs: the model's chat template never reads enable_thinkng, so it "
        "does nothing; the variables it reads are enable_thinking")


@pytest.fixture
def dated_model(demo_dir, tmp_path):
    """The demo model with Llama 3.2's template, which writes the day it renders when date_string is unset."""
    model = tmp_path / "dated-model"
    shutil.copytree(demo_dir / "model", model)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config["chat_template"] = (Path(__file__).parent / "tokenizer" / "real_templates" / "llama3_2.jinja").read_text(
        encoding="utf-8")
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    return model


def test_cli_train_fixes_the_date_a_template_stamps_and_a_resume_keeps_the_first_attempts(dated_model, demo_dir,
                                                                                          tmp_path, capsys):
    """Follow-up: jaxengine train fixed no date, so a job of a model whose template writes the day it renders rendered
    each day's in each attempt (the web launch fixed it). It fixes it as the web does (chat_template.date_to_fix),
    says so, and a resume in the same output_dir keeps the date its first attempt rendered."""
    from datetime import datetime

    path, run_dir = tmp_path / "spec.yaml", tmp_path / "run"
    path.write_text(yaml.safe_dump(_spec(dated_model, run_dir, demo_dir / "data/sft.jsonl")))
    before = datetime.now().strftime("%d %b %Y")
    assert main(["train", str(path), "--no-progress"]) == 0
    written = yaml.safe_load((run_dir / "spec.yaml").read_text())["data"]["chat_template_kwargs"]
    assert written.keys() == {"date_string"} and written["date_string"] in {before, datetime.now().strftime("%d %b %Y")}
    assert json.loads((run_dir / "export" / "chat_template_kwargs.json").read_text()) == written
    assert (f"{path}: data.chat_template_kwargs.date_string: {written['date_string']!r} fixed for every chat the job "
            "renders (today; the model's chat template writes the day it renders when it is unset); set it in the "
            "spec to render another day") in capsys.readouterr().err.splitlines()

    # Its first attempt on another day: a resume renders that day, not today.
    from jaxengine.job import with_fixed_template_date

    first = yaml.safe_load((run_dir / "spec.yaml").read_text())
    first["data"]["chat_template_kwargs"]["date_string"] = "01 Jan 2020"
    (run_dir / "spec.yaml").write_text(yaml.safe_dump(first))
    resumed, said = with_fixed_template_date(parse_spec(_spec(dated_model, run_dir, demo_dir / "data/sft.jsonl")))
    assert resumed.data.chat_template_kwargs == {"date_string": "01 Jan 2020"}
    assert said.startswith("data.chat_template_kwargs.date_string: '01 Jan 2020' fixed for every chat the job renders "
                           "(the date its first attempt in output_dir rendered;")
    # A date the spec gives, a template that stamps none, pretraining: nothing fixed.
    given = parse_spec(_spec(dated_model, run_dir, demo_dir / "data/sft.jsonl",
                             chat_template_kwargs={"date_string": "02 Feb 2031"}))
    assert with_fixed_template_date(given) == (given, None)
    plain = parse_spec(_spec(demo_dir / "model", tmp_path / "other", demo_dir / "data/sft.jsonl"))
    assert with_fixed_template_date(plain) == (plain, None)


NO_THINKING = "<|im_start|>assistant\n<think>\n\n</think>\n\n"


def test_the_job_renders_with_them_and_its_export_keeps_them(thinking_model, demo_dir, tmp_path):
    messages = [{"role": "user", "content": "2+2?"}]
    spec = parse_spec(_spec(thinking_model, tmp_path / "run", demo_dir / "data/sft.jsonl",
                            chat_template_kwargs={"enable_thinking": False}))
    tokenizer = build_job_model(spec).tokenizer
    assert tokenizer.apply_chat_template(messages, add_generation_prompt=True).endswith(NO_THINKING)
    base = load_tokenizer(thinking_model)
    assert not base.apply_chat_template(messages, add_generation_prompt=True).endswith(NO_THINKING)
    assert encode_prompt(tokenizer, messages) != encode_prompt(base, messages)
    # A request's own value wins over the run's.
    assert encode_prompt(tokenizer, messages, enable_thinking=True) == encode_prompt(base, messages)

    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    export = tmp_path / "run" / "export"
    assert json.loads((export / "chat_template_kwargs.json").read_text()) == {"enable_thinking": False}
    exported = load_tokenizer(export)
    assert exported.apply_chat_template(messages, add_generation_prompt=True).endswith(NO_THINKING)
    assert encode_prompt(exported, messages) == encode_prompt(tokenizer, messages)
    # The base model has none, and saving a tokenizer without any leaves none behind.
    assert not (thinking_model / "chat_template_kwargs.json").exists()
    load_tokenizer(thinking_model).save(export)
    assert not (export / "chat_template_kwargs.json").exists()
    # An export written before exports kept the file renders with its run's variables all the same (spec.yaml's).
    assert encode_prompt(load_tokenizer(export), messages) == encode_prompt(tokenizer, messages)


def test_an_export_leaves_out_the_models_own_variables_its_template_never_reads_and_the_log_says_so(
        thinking_model, demo_dir, tmp_path):
    """An export's chat_template_kwargs.json was its model's own variables under the spec's: a name the template never
    reads, which an export written before launches dropped them held (the web app's launch leaves such a name out of
    a new run's Run row only), was carried on into every descendant's export. Left out of the export now, said once
    in the run's log; the spec's own variables stay, read or not (its launch warned its author), and so do the model's
    that the template reads."""
    (thinking_model / "chat_template_kwargs.json").write_text(json.dumps({"enable_thinking": False, "persona": "pirate"}))
    spec = parse_spec(_spec(thinking_model, tmp_path / "run", demo_dir / "data/sft.jsonl",
                            chat_template_kwargs={"verbosity": "high"}))
    lines = []
    assert run_job(spec, progress_bar=False, on_log=lines.append)["status"] == "succeeded"
    exported = json.loads((tmp_path / "run" / "export" / "chat_template_kwargs.json").read_text())
    assert exported == {"enable_thinking": False, "verbosity": "high"}
    assert [line for line in lines if "persona" in line] == [
        f"chat_template_kwargs: persona of {thinking_model}'s own variables (its chat_template_kwargs.json) left out "
        "of this run's exports: the model's chat template never reads it"]
    assert not any("verbosity" in line or "enable_thinking" in line for line in lines)


def test_jaxengine_export_names_the_models_own_variables_it_leaves_out_once(thinking_model, demo_dir, tmp_path,
                                                                            caplog, capsys):
    """`jaxengine export` of a run whose model's chat_template_kwargs.json holds a variable its template never reads
    left it out of the export without a word (a run's own export says so in its log, above). Said once now: logged
    at info by ``export_run``, on stderr by the command."""
    import logging

    from jaxengine.job import export_run

    (thinking_model / "chat_template_kwargs.json").write_text(json.dumps({"enable_thinking": False, "persona": "pirate"}))
    run_dir = tmp_path / "run"
    spec = parse_spec(_spec(thinking_model, run_dir, demo_dir / "data/sft.jsonl"))
    assert run_job(spec, progress_bar=False)["status"] == "succeeded"
    note = (f"chat_template_kwargs: persona of {thinking_model}'s own variables (its chat_template_kwargs.json) left "
            "out of this run's exports: the model's chat template never reads it")
    with caplog.at_level(logging.INFO, logger="jaxengine.job"):
        export_run(run_dir)
    assert [record.getMessage() for record in caplog.records if "persona" in record.getMessage()] == [note]
    assert json.loads((run_dir / "export" / "chat_template_kwargs.json").read_text()) == {"enable_thinking": False}
    capsys.readouterr()
    assert main(["export", "--run", str(run_dir)]) == 0
    assert [line for line in capsys.readouterr().err.splitlines() if "persona" in line] == [f"{run_dir}: {note}"]


def test_an_export_without_the_file_takes_its_runs_variables(thinking_model, tmp_path):
    """An export made before exports kept chat_template_kwargs.json was served without the variables its run trained
    with (Qwen3 trained with thinking off answered thinking). Without the file, a run's export (export/,
    export-step-N/, and the serving copy quantized/ inside either) takes its run's data.chat_template_kwargs from
    the run's spec.yaml; the file, where there is one, is the export's own; another directory takes nothing."""
    messages = [{"role": "user", "content": "2+2?"}]
    run = tmp_path / "run"
    for export in ("export", "export-step-3", "export/quantized", "export-step-3/quantized", "model"):
        shutil.copytree(thinking_model, run / export)
    (run / "spec.yaml").write_text(yaml.safe_dump(_spec(thinking_model, run, "rows.jsonl",
                                                        chat_template_kwargs={"enable_thinking": False})))

    def rendered(directory):
        return load_tokenizer(directory).apply_chat_template(messages, add_generation_prompt=True)

    for export in ("export", "export-step-3", "export/quantized", "export-step-3/quantized"):
        assert rendered(run / export).endswith(NO_THINKING), export
        assert load_tokenizer(run / export).template_kwargs == {"enable_thinking": False}
    assert not rendered(run / "model").endswith(NO_THINKING)
    (run / "export-step-3" / "chat_template_kwargs.json").write_text('{"enable_thinking": true}')
    assert not rendered(run / "export-step-3").endswith(NO_THINKING)
    # A run that set none, and a spec whose variable is no scalar, named as the spec's key.
    (run / "spec.yaml").write_text(yaml.safe_dump(_spec(thinking_model, run, "rows.jsonl")))
    assert not rendered(run / "export").endswith(NO_THINKING)
    (run / "spec.yaml").write_text(yaml.safe_dump(_spec(thinking_model, run, "rows.jsonl",
                                                        chat_template_kwargs={"enable_thinking": [False]})))
    from jaxengine.tokenizer import TokenizerError

    with pytest.raises(TokenizerError, match=r"run/spec.yaml: data.chat_template_kwargs.enable_thinking: \[False\] is a list"):
        load_tokenizer(run / "export")


def test_a_job_told_not_to_reads_no_variables_from_an_old_exports_run_spec(thinking_model, demo_dir, tmp_path):
    """The web app gives a run started from a run's model the variables its Run row records (the one source) and
    sets data.run_spec_template_kwargs false: the job, its date fix and its tokenizer then take none from the old
    export's spec.yaml, which they laid under the Run row's, so a name only spec.yaml held was rendered all the same.
    Left true (jaxengine train's own spec), spec.yaml is the only record there is and is read."""
    from jaxengine.job import with_fixed_template_date

    run = tmp_path / "old-run"
    shutil.copytree(thinking_model, run / "export")
    (run / "spec.yaml").write_text(yaml.safe_dump(_spec(thinking_model, run, "rows.jsonl",
                                                        chat_template_kwargs={"enable_thinking": False})))
    recorded = {"reasoning_effort": "low"}
    told = parse_spec(_spec(run / "export", tmp_path / "new", demo_dir / "data/sft.jsonl",
                            chat_template_kwargs=recorded, run_spec_template_kwargs=False))
    assert build_job_model(told).tokenizer.template_kwargs == recorded
    assert with_fixed_template_date(told) == (told, None)  # Qwen3's template stamps no day
    untold = parse_spec(_spec(run / "export", tmp_path / "new", demo_dir / "data/sft.jsonl",
                              chat_template_kwargs=recorded))
    assert build_job_model(untold).tokenizer.template_kwargs == {"enable_thinking": False, **recorded}


def test_a_models_file_of_variables_that_are_no_scalars_is_named(thinking_model):
    from jaxengine.tokenizer import TokenizerError

    (thinking_model / "chat_template_kwargs.json").write_text('{"enable_thinking": [false]}')
    with pytest.raises(TokenizerError, match=r"chat_template_kwargs.json: enable_thinking: \[False\] is a list"):
        load_tokenizer(thinking_model)


@pytest.fixture(scope="module")
def tiny_thinking_model(tmp_path_factory):
    model_dir = factories.build_tiny_model_dir(tmp_path_factory.mktemp("tiny-thinking"))
    config = json.loads((model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = THINKING_TEMPLATE
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    return model_dir


def _generated_prompt(model_dir, capsys, *extra):
    assert main(["generate", "--model", str(model_dir), "--prompt", "2+2?", "--chat", "--max-new-tokens", "1",
                 "--temperature", "0", "--json", *extra]) == 0
    out, err = capsys.readouterr()
    return load_tokenizer(model_dir).decode(json.loads(out)["prompt_token_ids"]), err


def test_generate_template_var_sets_a_variable_for_the_prompt(tiny_thinking_model, capsys):
    plain, _ = _generated_prompt(tiny_thinking_model, capsys)
    assert plain.endswith("assistant:")
    off, err = _generated_prompt(tiny_thinking_model, capsys, "--template-var", "enable_thinking=false")
    assert off.endswith("assistant: <think></think>") and err == ""
    # A text value is a string, not false: the template's "is false" test does not hold.
    text, _ = _generated_prompt(tiny_thinking_model, capsys, "--template-var", "enable_thinking=no")
    assert text.endswith("assistant:")
    _, warned = _generated_prompt(tiny_thinking_model, capsys, "--template-var", "enable_thinkng=false")
    assert warned == ("warning: --template-var: the model's chat template never reads enable_thinkng, so it does "
                      "nothing; the variables it reads are enable_thinking\n")


@pytest.mark.parametrize(("arguments", "message"), [
    (["--chat", "--template-var", "enable_thinking"], "--template-var 'enable_thinking': give NAME=VALUE"),
    (["--chat", "--template-var", "messages=x"], "--template-var 'messages=x': 'messages' is set by the renderer"),
    (["--template-var", "enable_thinking=false"], "--template-var needs --chat"),
])
def test_generate_rejects_a_bad_template_var_in_one_line(tiny_thinking_model, capsys, arguments, message):
    assert main(["generate", "--model", str(tiny_thinking_model), "--prompt", "x", *arguments]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
