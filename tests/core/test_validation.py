"""pydantic errors as the file's key paths (hetflow.core.validation)."""

from __future__ import annotations

from typing import Annotated, Literal, Union

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hetflow.core.validation import describe, field_errors, known_keys


class _S(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Mlp(_S):
    kind: Literal["mlp"] = "mlp"
    hidden: list[int] = [64]


class Gpt(_S):
    kind: Literal["gpt"]
    layers: int = 2


class Replica(_S):
    name: str
    cpus: float = Field(1.0, gt=0)


class Root(_S):
    name: str
    model: Annotated[Union[Mlp, Gpt], Field(discriminator="kind")] = Mlp()
    replicas: list[Replica] = []
    train: Union[str, Mlp, None] = None


def errors(data: dict, **options) -> list[str]:
    with pytest.raises(ValidationError) as info:
        Root.model_validate(data)
    return [e.text() for e in field_errors(info.value, Root, **options)]


def test_unknown_key_inside_a_tagged_union_has_the_files_path_and_a_suggestion() -> None:
    assert errors({"name": "x", "model": {"kind": "gpt", "layerz": 3}}) == [
        "model.layerz: unknown key (did you mean 'layers'? known keys here: kind, layers)"]


def test_list_items_keep_their_index_and_their_section() -> None:
    assert errors({"name": "x", "replicas": [{"name": "a"}, {"name": "b", "cpu": 2}]}) == [
        "replicas.1.cpu: unknown key (did you mean 'cpus'? known keys here: cpus, name)"]
    assert errors({"name": "x", "replicas": [{"name": "a", "cpus": 0}]})[0].startswith(
        "replicas.0.cpus: Input should be greater than 0")


def test_missing_bad_tag_hints_and_the_value_given() -> None:
    assert errors({}) == ["name: missing; this field is required"]
    assert errors({"name": "x", "model": {"kind": "rnn"}}) == ["model.kind: must be mlp or gpt"]
    assert errors({}, hints={"missing": "required (see the docs)"}) == ["name: required (see the docs)"]
    shown = errors({"name": "x", "replicas": [{"name": "a", "cpus": "many"}]}, show_input=True)
    assert shown == ["replicas.0.cpus: Input should be a valid number, unable to parse string as a "
                     "number (got 'many')"]


def test_plain_union_members_are_not_levels_of_the_path() -> None:
    # pydantic reports train.str and train.Mlp; the file only has train
    assert sorted(errors({"name": "x", "train": 5})) == [
        "train: Input should be a valid dictionary or instance of Mlp",
        "train: Input should be a valid string"]


def test_known_keys_and_one_line_description() -> None:
    assert known_keys(Root, ("replicas", "0")) == ["cpus", "name"]
    assert known_keys(Root, ("nope",)) == []
    with pytest.raises(ValidationError) as info:
        Root.model_validate({"nam": "x"})
    assert describe(info.value, Root, "job.yaml") == (
        "job.yaml: name: missing; this field is required; nam: unknown key (did you mean "
        "'name'? known keys here: model, name, replicas, train)")
