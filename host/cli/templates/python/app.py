"""@NAME@: a kiln operand plugin in Python (`kiln:operand@0.2.0`, `wit/operand.wit`).

It adds the labels its settings name to every object of the state:

    kiln.dev/plugins: |
      device-plugin:
        then:
          - name: @NAME@
            settings: {labels: {team: gpu}}

Edit `transform` (and `validate_settings`) to do what your site needs; `cases/` holds the
case files `kiln plugin test @NAME@.wasm cases` runs. The plugin runs in kiln's virtual WASI:
no files, no network, a fixed clock and randomness seeded from its inputs, so the same inputs
always give the same result.
"""

import json

import wit_world
from componentize_py_types import Err
from wit_world.imports import types

# The name the plugin is installed and named by (`@NAME@.wasm`).
NAME = "@NAME@"


def labels(settings):
    """The settings' `labels` (a map of strings; empty when the settings are `null`), or the
    refused fields."""
    try:
        value = json.loads(settings)
    except ValueError as e:
        return None, [types.FieldError(path="", message=str(e))]
    found = value.get("labels") if isinstance(value, dict) else None
    if found is None:
        return {}, None
    if not isinstance(found, dict):
        return None, [types.FieldError(path="labels", message=f"expected a map, got {json.dumps(found)}")]
    for key, v in found.items():
        if not isinstance(v, str):
            return None, [types.FieldError(path=f"labels.{key}", message=f"expected a string, got {json.dumps(v)}")]
    return found, None


class WitWorld(wit_world.WitWorld):
    def name(self) -> str:
        return NAME

    def validate_settings(self, plugin: str, settings: str) -> None:
        _, errors = labels(settings)
        if errors:
            raise Err(errors)

    def transform(self, objects, spec, settings, ctx):
        found, errors = labels(settings)
        if errors:
            e = errors[0]
            raise Err(types.TransformError_InvalidField(types.FieldError(path=f"settings.{e.path}", message=e.message)))
        wit_world.log(types.LogLevel.INFO, f"{len(objects)} objects of state {ctx.state}")
        outcomes = []
        for text in objects:
            obj = json.loads(text)
            ops = []
            if "labels" not in obj.get("metadata", {}) and found:
                ops.append({"op": "add", "path": "/metadata/labels", "value": {}})
            for key, value in found.items():
                escaped = key.replace("~", "~0").replace("/", "~1")
                ops.append({"op": "add", "path": f"/metadata/labels/{escaped}", "value": value})
            outcomes.append(types.Outcome_Patch(json.dumps(ops)))
        return outcomes
