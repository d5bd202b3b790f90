"""The index and sft stages pin their CPU numerics so their outputs have the same bytes on any
x86-64 CPU model (agent_r1.stages.common.PORTABLE_CPU_NUMERICS): the settings are honoured,
the right stages use them, and (slow, under qemu) another vendor's CPU gets the same weights."""

from __future__ import annotations

import platform
import runpy
import shutil
import sys
from pathlib import Path

import pytest

from agent_r1.stages import common

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.portable_numerics import run_worker, settings  # noqa: E402

x86_only = pytest.mark.skipif(platform.machine() != "x86_64", reason="the pinned settings are x86-64's")


@pytest.mark.parametrize("module, pinned", [("index", True), ("sft", True), ("train", False), ("evaluate", False)])
def test_the_stages_downstream_is_keyed_on_pin_their_numerics(
    module: str, pinned: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict] = []
    monkeypatch.setattr(common, "run_stage", lambda *a, **kw: calls.append(kw))
    runpy.run_module(f"agent_r1.stages.{module}", run_name="__main__")
    assert calls and calls[0].get("portable_numerics", False) is pinned


def test_pinning_after_torch_is_imported_is_refused() -> None:
    import torch  # noqa: F401  (PyTorch has read its settings by now)

    with pytest.raises(RuntimeError, match="before torch is imported"):
        common.pin_portable_numerics()


@x86_only
def test_the_pinned_settings_change_the_kernels_taken() -> None:
    """Not ignored: PyTorch reports the pinned vector width, and the weights after the same
    step differ from the unpinned ones (this CPU's widest kernels)."""
    default = run_worker(settings()["default"], None)
    portable = run_worker(settings()["portable"], None)
    assert portable["capability"] == "AVX2"
    assert portable["sha256"] != default["sha256"]


@pytest.mark.slow
@x86_only
@pytest.mark.skipif(shutil.which("qemu-x86_64") is None, reason="needs qemu-x86_64 (Debian: qemu-user)")
def test_an_amd_cpu_gets_the_same_weights_under_the_pinned_settings() -> None:
    """Emulating an AMD EPYC (AVX2, no AVX-512): the portable setting's weights equal this CPU's."""
    amd, here = (run_worker(settings()["portable"], cpu) for cpu in ("EPYC-Milan", None))
    assert (amd["capability"], amd["sha256"]) == (here["capability"], here["sha256"])


def test_the_real_machine_check_reads_the_pinned_outputs_and_the_first_departing_step() -> None:
    """bench/pinned_outputs.py: the pinned outputs' hashes out of a lock, and the first step
    whose warm-start loss differs in any bit (not a tolerance: bytes are what DVC compares)."""
    from bench.pinned_outputs import first_departure, out_hashes

    outs = {"index": [{"path": "indexes/bm25", "md5": "a.dir"}, {"path": "indexes/dense", "md5": "b.dir"},
                      {"path": "metrics/retrieval.json", "md5": "c"}],
            "sft": [{"path": "metrics/sft.json", "md5": "d"}, {"path": "models/sft", "md5": "e.dir"}]}
    assert out_hashes({"stages": {s: {"outs": o} for s, o in outs.items()}}) == {
        "indexes/bm25": "a.dir", "indexes/dense": "b.dir", "models/sft": "e.dir"}
    assert first_departure([1.5, 0.25, 0.125], [1.5, 0.25, 0.125]) is None
    assert first_departure([1.5, 0.2411026838235557, 0.1], [1.5, 0.24110258230939507, 0.1]) == 1


def test_two_traces_of_the_warm_start_name_where_they_first_differ() -> None:
    """A loss bit before an update: the forward or backward of that micro-batch; equal losses and
    other weights after: the update."""
    from bench.pinned_outputs import first_trace_difference

    a = [{"losses": ["3f800000", "3e800000"], "weights": "w0"}, {"losses": ["3e000000"], "weights": "w1"}]
    assert first_trace_difference(a, a) is None
    assert first_trace_difference(a, [a[0], {"losses": ["3e000001"], "weights": "w1"}]) == "step 1, micro-batch 0: loss"
    assert first_trace_difference(a, [{**a[0], "weights": "x"}, a[1]]) == "step 0: the weights after the update"
    b = [{**step, "grad_norm": "404c5d55"} for step in a]
    assert first_trace_difference(b, [b[0], {**b[1], "grad_norm": "404c5d56"}]) == "step 1: the gradient norm"


def test_traces_are_compared_only_when_the_sft_stage_read_the_same_inputs() -> None:
    """A trace recorded with other code or data departs for that reason, not the CPU's."""
    from bench.pinned_outputs import sft_inputs

    deps = [{"path": "agent_r1/training/models.py", "md5": "1"}, {"path": "models/policy", "md5": "2.dir"}]
    lock = {"stages": {"sft": {"deps": deps}}}
    assert sft_inputs(lock) == sft_inputs({"stages": {"sft": {"deps": deps[::-1]}}})
    assert sft_inputs(lock) != sft_inputs({"stages": {"sft": {"deps": [deps[0], {**deps[1], "md5": "3.dir"}]}}})
