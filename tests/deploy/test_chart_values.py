"""The chart's values.yaml against its values.schema.json and against the Helm page, without helm.

Helm validates values with the schema before it renders (tests/deploy/test_chart.py checks that a typo
fails there); here the schema itself is checked with the jsonschema library: the shipped defaults pass,
every default key is declared (so the schema cannot silently lag behind values.yaml), and misspelt or
mistyped values fail naming the key. The Helm page's table states the default resources; they must be
values.yaml's.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft7Validator

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "dispatch"


def values() -> dict[str, Any]:
    got = yaml.safe_load((CHART / "values.yaml").read_text())
    assert isinstance(got, dict)
    return got


def validator() -> Draft7Validator:
    schema = json.loads((CHART / "values.schema.json").read_text())
    Draft7Validator.check_schema(schema)
    return Draft7Validator(schema)


def errors(doc: dict[str, Any]) -> list[str]:
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(doc))


def test_the_defaults_pass_the_schema() -> None:
    assert errors(values()) == []


def _closed_objects(schema: dict[str, Any], value: Any, path: str) -> list[str]:
    """Keys of ``value`` (the defaults) that the schema does not declare, where it declares properties."""
    if not isinstance(value, dict) or "properties" not in schema:
        return []
    out = [f"{path}{k}" for k in value if k not in schema["properties"]]
    for k, v in value.items():
        if k in schema["properties"]:
            out += _closed_objects(schema["properties"][k], v, f"{path}{k}.")
    return out


def test_every_default_key_is_declared_and_closed() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert _closed_objects(schema, values(), "") == []
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(("change", "expected"), [
    ({"replica": 3}, ": Additional properties are not allowed ('replica' was unexpected)"),
    ({"replicas": "3"}, "replicas: '3' is not of type 'integer'"),
    ({"image": {"registy": "r"}}, "image: Additional properties are not allowed ('registy' was unexpected)"),
    ({"image": {"digest": "abc"}}, "image/digest: 'abc' does not match '^(|sha256:[a-f0-9]{64})$'"),
    ({"podDisruptionBudget": {"minAvailable": 0}}, "podDisruptionBudget/minAvailable: 0 is less than the minimum of 1"),
    ({"controller": {"foreign": "pass"}}, "controller/foreign: 'pass' is not one of ['ready', 'ignore']"),
    ({"monitoring": {"serviceMonitor": {"label": {"release": "x"}}}},
     "monitoring/serviceMonitor: Additional properties are not allowed ('label' was unexpected)"),
    ({"imagePullSecrets": ["regcred"]}, "imagePullSecrets/0: 'regcred' is not of type 'object'"),
    ({"guard": {"clientAuth": {"names": ["kube-apiserver,other"]}}},
     "guard/clientAuth/names/0: 'kube-apiserver,other' does not match '^[^,]+$'"),
    ({"guard": {"clientAuth": {"ca": "x"}}},
     "guard/clientAuth: Additional properties are not allowed ('ca' was unexpected)"),
])
def test_typos_and_wrong_types_fail_naming_the_key(change: dict[str, Any], expected: str) -> None:
    doc = copy.deepcopy(values())
    for key, val in change.items():
        if isinstance(val, dict) and isinstance(doc.get(key), dict):
            merged = doc[key]
            for k2, v2 in val.items():
                if isinstance(v2, dict) and isinstance(merged.get(k2), dict):
                    merged[k2] = {**merged[k2], **v2}
                else:
                    merged[k2] = v2
        else:
            doc[key] = val
    assert errors(doc) == [expected]


def test_the_helm_pages_resources_are_the_values() -> None:
    page = (ROOT / "docs" / "how-to" / "install-helm.md").read_text()
    [row] = [line for line in page.splitlines() if line.startswith("| `resources` |")]
    m = re.search(r"requests (\S+) CPU and (\S+), limit (\S+) \|", row)
    assert m is not None, row
    res = values()["resources"]
    assert m.groups() == (res["requests"]["cpu"], res["requests"]["memory"], res["limits"]["memory"])
    deployment = yaml.safe_load((ROOT / "deploy" / "base" / "deployment.yaml").read_text().split("\n---\n")[0])
    assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"] == res


def _readme_script() -> Any:
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("chart_readme", str(ROOT / "scripts" / "chart-readme"))
    spec = importlib.util.spec_from_loader("chart_readme", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def test_the_charts_readme_lists_every_value_with_its_default_and_meaning() -> None:
    """charts/dispatch/README.md is what scripts/chart-readme writes from values.yaml, so it lists every
    value; and each value is explained (by its own comment or its section's)."""
    script = _readme_script()
    page = (CHART / "README.md").read_text()
    assert page == script.page(), "charts/dispatch/README.md is stale: run scripts/chart-readme"
    said = script.comments((CHART / "values.yaml").read_text())
    unexplained = []
    for path, _ in script.leaves(values()):
        assert f"| `{path}` | `" in page, path
        parts = path.split(".")
        if not any(".".join(parts[:i]) in said for i in range(len(parts), 0, -1)):
            unexplained.append(path)
    assert unexplained == []


def test_the_readme_finds_each_keys_comment() -> None:
    said = _readme_script().comments("# top\na:\n  # inner\n  b: 1\n\n  c: 2\n# list\nd:\n  - x: 1\n")
    assert said == {"a": "top", "a.b": "inner", "d": "list"}
