"""The fake's strategic merge (``dispatch.testing._smp``) against what the real apimachinery made of each case.

``data/strategic-merge.json`` was recorded with ``k8s.io/apimachinery`` v0.37.2's ``StrategicMergePatch`` over
``batchv1.JobTemplateSpec``, the call Trainer makes for each replicatedJob of each runtime patch entry; the
fake's Trainer builds its JobSets with the port, so a directive the fake misreads would be a fake that hides
(or invents) a way to strip dispatch's labels from pods.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dispatch.testing._smp import PatchError, strategic_merge, trainer_patch

DATA = json.loads((Path(__file__).parent / "data" / "strategic-merge.json").read_text())
CASES: list[dict[str, Any]] = DATA["cases"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_the_port_merges_as_apimachinery_did(case: dict[str, Any]) -> None:
    if case.get("error"):
        with pytest.raises(PatchError):
            strategic_merge(DATA["source"], case["patch"])
        return
    assert strategic_merge(DATA["source"], case["patch"]) == case["merged"], case["why"]


def test_the_recorded_cases_show_a_labels_directive_strips_dispatchs_identity() -> None:
    """The finding of issue 35, item 1, as the real merge made it: ``$patch: replace`` (or ``delete``) on a pod
    template's labels leaves none of dispatch's labels, while the pod template keeps dispatch's finalizer."""
    by_name = {c["name"]: c for c in CASES}
    for name in ("labels-replace", "labels-delete"):
        meta = by_name[name]["merged"]["spec"]["template"]["metadata"]
        assert not [k for k in meta.get("labels", {}) if k.startswith("dispatch.phpboyscout.uk/")], name
        assert meta["finalizers"] == ["dispatch.phpboyscout.uk/execution"], name


def test_what_trainer_merges_keeps_directives_only_as_keys_of_string_maps() -> None:
    entry = {"metadata": {"$patch": "replace", "labels": {"$patch": "replace", "a": "b"},
                          "$deleteFromPrimitiveList/finalizers": ["x"]},
             "spec": {"template": {"spec": {"$retainKeys": ["containers"], "nodeSelector": {"$patch": "delete"},
                                            "containers": [{"name": "node", "$patch": "delete"}]}}}}
    assert trainer_patch(entry) == {"metadata": {"labels": {"$patch": "replace", "a": "b"}},
                                    "spec": {"template": {"spec": {"nodeSelector": {"$patch": "delete"},
                                                                   "containers": [{"name": "node"}]}}}}
