"""The launch form built from the spec schema: widgets per type, values read back."""
import pytest
from django.core.exceptions import ValidationError
from django.http import QueryDict
from pydantic import BaseModel, Field

from webapp.runs import specform


class Term(BaseModel):
    name: str
    weight: float = 1.0


class Section(BaseModel):
    """``demo``: every kind of key."""

    mode: specform.Literal["a", "b"] = "a"
    on: bool = False
    rate: float | None = Field(default=None, description="A rate.")
    names: tuple[specform.Literal["x", "y"], ...] = ("x",)
    terms: tuple[Term, ...] = Field(default=(Term(name="t"),), description="Terms.")
    label: str = "hi"


def fields():
    return {key: specform._spec_field("demo", key, info) for key, info in Section.model_fields.items()}


def test_each_type_gets_its_widget():
    built = fields()
    assert [built[key].widget for key in ("mode", "on", "rate", "names", "terms", "label")] == [
        "select", "checkbox", "number", "multi", "json", "text"]
    assert built["mode"].choices == ("a", "b") and built["rate"].optional and built["rate"].help == "A rate."
    assert built["terms"].default == [{"name": "t", "weight": 1.0}]


def test_values_are_read_back_and_bad_json_names_its_key(monkeypatch):
    section = specform.SpecSection(name="demo", title="demo", fields=tuple(fields().values()))
    monkeypatch.setattr(specform, "form_sections", lambda task: [section])
    monkeypatch.setattr(specform, "task_section_names", lambda task: ("data", "demo"))
    data = QueryDict(mutable=True)
    data.update({"model": "bm_x", "data.train": "dv_y", "demo.mode": "b", "demo.on": "on", "demo.rate": "",
                 "demo.terms": '[{"name": "u", "weight": 2}]', "demo.label": "there"})
    data.setlist("demo.names", ["x", "y"])
    spec = specform.spec_from_form("sft", data)
    assert spec["demo"] == {"mode": "b", "on": True, "rate": None, "names": ["x", "y"],
                            "terms": [{"name": "u", "weight": 2}], "label": "there"}
    assert spec["data"] == {"train": "dv_y"}
    data["demo.terms"] = "[{name: u}]"
    with pytest.raises(ValidationError) as caught:
        specform.spec_from_form("sft", data)
    assert "demo.terms" in caught.value.message_dict


def test_data_columns_are_not_a_form_field():
    names = {field.name for section in specform.form_sections("sft") for field in section.fields}
    assert "data.columns" not in names and "data.train" not in names and "data.max_seq_len" in names
