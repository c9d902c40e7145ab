"""kubectl's JSONPath dialect, as ``-o jsonpath`` and ``-o custom-columns`` read it (expected outputs are
what ``kubectl get -o jsonpath`` prints for the same document)."""

from __future__ import annotations

from typing import Any

import pytest

from dispatch.cli._jsonpath import TemplateError, parse_path, parse_template

DOC: dict[str, Any] = {
    "kind": "List",
    "items": [
        {"name": "a", "labels": {"dispatch.phpboyscout.uk/job-id": "llama", "team": "ml"}, "a": 1,
         "pods": [{"node": "n0"}, {"node": "n1"}], "ok": True, "queue": None},
        {"name": "b", "labels": {"team": "cv"}, "a": 3, "pods": [], "ok": False, "queue": "q"},
        {"name": "c", "labels": {}, "a": 2, "pods": [{"node": "n2"}], "ok": True, "queue": None},
    ],
}


@pytest.mark.parametrize(("template", "printed"), [
    ("{.items[*].name}", "a b c"),
    ("{.items[0].name}", "a"),
    ("{.items[-1].name}", "c"),
    ("{.items[0:2].name}", "a b"),
    ("{.items[::2].name}", "a c"),
    ("{.items[0,2].name}", "a c"),
    ("{.items[0]['name','a']}", "a 1"),
    ("{..node}", "n0 n1 n2"),
    ("{.items[*].pods[*].node}", "n0 n1 n2"),
    (r"{.items[0].labels.dispatch\.phpboyscout\.uk/job-id}", "llama"),
    ("{.items[?(@.a > 1)].name}", "b c"),
    ("{.items[?(@.a >= 2.0)].name}", "b c"),
    ('{.items[?(@.labels.team == "ml")].name}', "a"),
    ("{.items[?(@.labels.team != 'ml')].name}", "b"),
    ("{.items[?(@.queue)].name}", "b"),
    ("{.items[?(@.ok == true)].name}", "a c"),
    ("{.items[0].pods}", '[{"node":"n0"},{"node":"n1"}]'),
    ("{.items[0].ok} {.items[0].queue}|", "true |"),
    ("{$.kind}", "List"),
    ("{.items[0].labels.*}", "llama ml"),
    ('{range .items[*]}{.name}{":"}{range .pods[*]}{.node},{end}{"\\n"}{end}', "a:n0,n1,\nb:\nc:n2,\n"),
    ("{range .items}{.name}{end}", "abc"),
    ("names: {.items[*].name}.", "names: a b c."),
    ("{.missing.key}", ""),
])
def test_templates_print_as_kubectl(template: str, printed: str) -> None:
    assert parse_template(template).render(DOC) == printed


@pytest.mark.parametrize("bad", ["", "{", "{}", "{.a", "{.a[}", "{.a[x]}", "{.a[1:2:0]}", "{end}",
                                 "{range .a}", "{.a[?(b)]}", "{a}"])
def test_bad_templates_are_refused(bad: str) -> None:
    with pytest.raises(TemplateError):
        parse_template(bad)


def test_a_path_alone_is_a_custom_column() -> None:
    assert parse_path(".items[1].name").find(DOC, DOC) == ["b"]
    assert parse_path("$.kind").find(DOC["items"][0], DOC) == ["List"]
