"""Request bodies of the REST API, validated by pydantic; errors name the field."""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat, model_validator

from webapp.core.numbers import MAX_STORED_INT
from webapp.runs.services import RUN_NAME_MAX

# Steps are stored as PositiveIntegerFields, token counts as 64-bit integers: past these an INSERT failed
# (OverflowError, a 500) instead of naming the field.
MAX_TOKENS = 2**62


class _Body(BaseModel):
    # strict: "64" is not 64, nor 1 true; a script that sends text for a number is told, not guessed at.
    model_config = ConfigDict(extra="forbid", strict=True)


class RunCreate(_Body):
    """Launch a run from a job spec (ids in place of paths, as in the web's YAML view), or open an
    external run (``external: true``) that a process elsewhere logs into."""

    spec: dict[str, Any] | None = Field(default=None, description="The job spec as a mapping.")
    spec_yaml: str | None = Field(default=None, description="Or the job spec as YAML text.")
    name: str = Field(default="", description=f"At most {RUN_NAME_MAX} characters (a longer name is refused, "
                                              "not cut); blank: one made from the spec, or 'external run'.")
    tags: list[str] = Field(default_factory=list)
    sweep: dict[str, list[Any]] | None = Field(
        default=None, description="A run for every combination of these spec keys' values, e.g. "
                                  '{"optim.learning_rate": [0.0001, 0.0003], "peft.rank": [8, 16]} (4 runs): each '
                                  "the spec with those keys set, named after its values and tagged sweep-<id>; all "
                                  "are checked before any is made, at most TEMPER_SWEEP_MAX_RUNS (default 16) of them. The "
                                  'answer is {"sweep": tag, "runs": [...]}, in the order they were queued.')
    external: bool = Field(default=False, description="Open a run trained elsewhere; give config, not spec.")
    config: dict[str, Any] | None = Field(default=None, description="External runs: their hyper-parameters.")

    @model_validator(mode="after")
    def _one_source(self) -> RunCreate:
        if self.external:
            if self.spec is not None or self.spec_yaml is not None or self.sweep is not None:
                raise ValueError("an external run takes config, not spec, spec_yaml or sweep")
        elif (self.spec is None) == (self.spec_yaml is None):
            raise ValueError("give exactly one of spec and spec_yaml (or external: true)")
        return self


class RunResume(_Body):
    max_steps: int | None = Field(default=None, ge=1, description="Train on to this many steps in all.")


class MetricsPoint(_Body):
    step: int = Field(ge=0, le=MAX_STORED_INT)
    metrics: dict[str, float] = Field(min_length=1, description="{name: value} logged at this step.")
    tokens: int | None = Field(default=None, ge=0, le=MAX_TOKENS, description="Tokens trained on up to this step.")
    # finite: a NaN was dropped after the answer counted it stored (SQLite keeps it as NULL), and an
    # infinity was stored, making the run's series 'Infinity', which JSON readers (the charts) refuse.
    wall_time: FiniteFloat | None = Field(default=None, description="Unix time of the step (default: now).")


class MetricsLog(_Body):
    points: list[MetricsPoint] = Field(min_length=1, max_length=100_000)


class SampleIn(_Body):
    step: int = Field(ge=0, le=MAX_STORED_INT)
    prompt: str | list[dict[str, str]]
    text: str
    answer: str | None = None
    rewards: dict[str, FiniteFloat] | None = None  # stored as JSON, which has no NaN or infinity


class SamplesLog(_Body):
    samples: list[SampleIn] = Field(min_length=1, max_length=10_000)


class RunFinish(_Body):
    status: Literal["succeeded", "failed", "cancelled"]
    message: str = ""
