"""The shape issue 36 asked for, held where it can be read from the source (``scripts/structure`` measures it
and prints every measure; these are the ones a later change could quietly undo)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]


def structure() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("structure_script", str(ROOT / "scripts" / "structure"))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # its dataclasses look their module up
    loader.exec_module(module)
    return module


def test_one_retry_on_conflict_loop_and_one_sentence_for_giving_up() -> None:
    s = structure()
    assert s.conflict_loops() == [s.conflict_loops()[0]] and s.conflict_loops()[0].startswith("dispatch._kube:")
    sentences = [p for p in (ROOT / "src" / "dispatch").rglob("*.py") if "kept changing" in p.read_text()]
    assert [p.name for p in sentences] == ["_kube.py"]
    assert len(re.findall("kept changing", (ROOT / "src" / "dispatch" / "_kube.py").read_text())) == 1


def test_one_obj_type_and_one_event_body() -> None:
    s = structure()
    assert s.obj_aliases() == ["dispatch._api"]
    assert [b.split(":")[0] for b in s.event_builders()] == ["dispatch._events"]


def test_no_arrow_runs_back_up_and_no_circle_between_rooms() -> None:
    s = structure()
    assert s.rooms() == ([], [])


def test_the_guards_certificates_live_in_tls() -> None:
    guard = (ROOT / "src" / "dispatch" / "controller" / "_guard.py").read_text()
    for name in ("def generate_certs", "def renewal_due", "def load_or_generate", "def merged_bundle",
                 "def publish_ca", "x509", "caBundle\"]"):
        assert name not in guard, name


def test_one_admission_entry_one_place_for_its_inputs_and_no_policy_outside_the_core() -> None:
    s = structure()
    classes = s._classes()
    calls = s.protocol_calls(classes)
    # the verb's inputs all come from Reader.inputs, its verdict and writes from admission; it unsuspends only
    # where the raise could not start the execution itself (a raise found, a Trainer before v2.2.1)
    assert calls["verb"] == ["admission", "inputs", "unsuspend"]
    # the reconciler reads its TrainJobs alone first (Reader.inputs without the lower layers), to screen them
    # against their Workloads; then the rest of their inputs
    assert calls["reconciler"] == ["admission", "inputs", "write_check"]
    assert s.inputs_gathered(classes) == ["Reader.inputs"]
    assert s.order_spelled(classes) == ["dispatch._core"]
    assert s.policy_outside() == []
    assert sum(s.api_calls_outside().values()) <= 5


def test_the_adapter_holds_the_user_verbs_only_and_a_release_visits_it_twice() -> None:
    s = structure()
    classes = s._classes()
    lines, _, others = s.adapter_shape(classes)
    assert lines <= 450 and others == []
    assert len(s.adapter_visits(classes)) <= 2


def test_the_guard_and_the_finalizer_keeper_read_through_a_reader_alone() -> None:
    for name in ("_guard.py", "_finalizers.py"):
        text = (ROOT / "src" / "dispatch" / "controller" / name).read_text()
        assert "Cores" not in text and "import Core" not in text, name
    core = (ROOT / "src" / "dispatch" / "_core.py").read_text()
    assert "class Core:" in core and "class Core(Reader)" not in core


def test_a_plain_release_takes_fewer_sequential_round_trips() -> None:
    """Counted (not timed): a request sent while none is in flight starts a round; 12 before issue 36, 11 after
    its first part. Every input is read at once after the TrainJob, and A is raised and the execution started in
    one write; a Trainer before v2.2.1 needs the unsuspend apart (one round more)."""
    stays, requests, rounds = structure().trace_release()
    assert stays and requests == 14
    assert rounds <= 8
    _, requests, rounds = structure().trace_release(trainer_before_2_2_1=True)
    assert requests == 15 and rounds <= 9
