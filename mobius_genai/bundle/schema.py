"""Validate genai_config.json and mobius_manifest.json against the JSON Schemas in schemas/.

Errors become one BundleError whose message names the file and the dotted path of each bad
field ("genai_config.json: model.decoder.head_size: 'eight' is not of type 'integer'").
`read_bundle_json` is the one way a bundle's JSON files are read: every command that reads one
(run, chat, bench, validate, the smoke test, Olive's MobiusFinalize) gets a document of the
shape its schema describes, or that one-line error, before it reads a field.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import jsonschema

from mobius_genai import _resources
from mobius_genai._json import read_json
from mobius_genai.checkpoint._safetensors import shown
from mobius_genai.errors import BundleError

GENAI_CONFIG_SCHEMA = "schemas/genai_config.schema.json"
MANIFEST_SCHEMA = "schemas/manifest.schema.json"
#: A bundle's JSON files, and the schema of each.
BUNDLE_SCHEMAS = {
    "genai_config.json": GENAI_CONFIG_SCHEMA,
    "mobius_manifest.json": MANIFEST_SCHEMA,
}

_MAX_REPORTED = 5


def validate_genai_config(document: Any, filename: str = "genai_config.json") -> None:
    """Raise BundleError unless `document` is a genai_config onnxruntime-genai 0.18 accepts."""
    validate_document(document, GENAI_CONFIG_SCHEMA, filename)


def validate_manifest(document: Any, filename: str = "mobius_manifest.json") -> None:
    """Raise BundleError unless `document` is a valid mobius-genai manifest."""
    validate_document(document, MANIFEST_SCHEMA, filename)


def read_bundle_json(path: Path, label: str | None = None) -> dict[str, Any]:
    """The bundle file `path` (one of BUNDLE_SCHEMAS), read and checked against its schema; a
    BundleError naming it (`label`, default its name) when it is unreadable or of another shape
    (`[]`, a string, a `model` that is a list, ...)."""
    label = label or path.name
    document = read_json(path, BundleError, label)
    validate_document(document, BUNDLE_SCHEMAS[path.name], label)
    return document


def validate_document(document: Any, schema: str, filename: str) -> None:
    """Validate `document` against the data file `schema`; errors name `filename` and fields."""
    errors = sorted(
        _validator(schema).iter_errors(document),
        key=lambda error: [str(part) for part in error.absolute_path],
    )
    if errors:
        problems = [_describe(error) for error in errors[:_MAX_REPORTED]]
        more = len(errors) - _MAX_REPORTED
        if more > 0:
            problems.append(f"and {more} more")
        raise BundleError(f"{filename}: " + "; ".join(problems))


@functools.cache
def _validator(schema: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(
        _resources.read_json(schema),
        format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER,
    )


def _field(path: list[str]) -> str:
    return ".".join(path) if path else "(top level)"


def _describe(error: jsonschema.ValidationError) -> str:
    path = [str(part) for part in error.absolute_path]
    instance = error.instance
    if error.validator == "required" and isinstance(instance, dict):
        missing = [key for key in error.validator_value if key not in instance]
        return ", ".join(f"{_field([*path, key])}: required field is missing" for key in missing)
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        known = sorted(error.schema.get("properties", {}))
        extra = [key for key in instance if key not in known]
        return ", ".join(
            f"{_field([*path, key])}: unknown field; accepted: {known}" for key in extra
        )
    if error.validator == "type":  # the value may be megabytes long
        expected = error.validator_value
        types = expected if isinstance(expected, list) else [expected]
        return f"{_field(path)}: {shown(instance)} is not of type {', '.join(map(repr, types))}"
    return f"{_field(path)}: {error.message}"
