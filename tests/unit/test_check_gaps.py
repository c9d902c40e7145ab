"""Which ClusterQueues let a Workload be admitted without asking dispatch's check (``_kueue.check_gaps``)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch._kueue import check_gaps

OURS = frozenset({"dispatch"})


def cq(*, covered: tuple[str, ...] = ("cpu", "memory", "pods"), flavors: tuple[str, ...] = ("default",),
       strategy: list[dict[str, Any]] | None = None, legacy: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"resourceGroups": [{"coveredResources": list(covered), "flavors": [
        {"name": f, "resources": [{"name": r, "nominalQuota": "10"} for r in covered]} for f in flavors]}]}
    if strategy is not None:
        spec["admissionChecksStrategy"] = {"admissionChecks": strategy}
    if legacy is not None:
        spec["admissionChecks"] = legacy
    return {"metadata": {"name": "cq"}, "spec": spec}


def test_a_queue_covering_pods_with_the_check_on_every_flavor_has_no_gap() -> None:
    assert check_gaps(cq(strategy=[{"name": "dispatch"}]), OURS) == ()
    assert check_gaps(cq(legacy=["dispatch"]), OURS) == ()
    assert check_gaps(cq(flavors=("a", "b"), strategy=[{"name": "dispatch", "onFlavors": ["a", "b"]}]), OURS) == ()


@pytest.mark.parametrize("queue", [cq(covered=("cpu",)), cq(covered=("cpu",), strategy=[{"name": "other"}]),
                                   {"metadata": {"name": "cq"}}, {"spec": "not a mapping"}])
def test_a_queue_that_does_not_name_our_check_is_not_ours_to_judge(queue: dict[str, Any]) -> None:
    assert check_gaps(queue, OURS) == ()


def test_a_queue_without_pods_lets_a_workload_that_requests_nothing_skip_the_check() -> None:
    assert check_gaps(cq(covered=("cpu", "memory"), strategy=[{"name": "dispatch"}]), OURS) == (
        "a Workload that requests none of cpu, memory is given no flavor, and Kueue v0.19 and later admit it "
        "without asking check dispatch: add `pods` to the coveredResources of a resource group",)
    assert check_gaps(cq(covered=(), legacy=["dispatch"]), OURS)[0].startswith(
        "a Workload that requests none of its covered resources is given no flavor")


def test_a_check_on_some_flavors_names_the_flavors_that_skip_it() -> None:
    got = check_gaps(cq(flavors=("spot", "on-demand", "reserved"),
                        strategy=[{"name": "dispatch", "onFlavors": ["reserved"]}]), OURS)
    assert got == ("Workloads given flavor on-demand, spot skip check dispatch (its onFlavors names only reserved)",)


def test_both_gaps_and_several_checks_of_ours() -> None:
    got = check_gaps(cq(covered=("cpu",), flavors=("a", "b"),
                        strategy=[{"name": "dispatch", "onFlavors": ["a"]}, {"name": "canary"}]),
                     frozenset({"dispatch", "canary"}))
    assert got == ("Workloads given flavor b skip check dispatch (its onFlavors names only a)",
                   "a Workload that requests none of cpu is given no flavor, and Kueue v0.19 and later admit it "
                   "without asking check canary, dispatch: add `pods` to the coveredResources of a resource group")
