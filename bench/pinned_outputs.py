"""After `make run` on this machine: did the pinned outputs come out with the committed bytes?

The `index` and `sft` stages pin their floating point (``PORTABLE_CPU_NUMERICS``) so that
the indexes and the warm start, which every paper run is keyed on, have the same bytes on
any x86-64 CPU; `bench/portable_numerics.py` checks that under emulation. This is the check
on a real machine: it compares the hashes `make run` wrote into ``dvc.lock`` with those of
the committed lock (``git show REV:dvc.lock``), finds the first step where the warm start's
training loss departs from the committed one (metrics/sft.json), and counts the stages of
paper/dvc.yaml that DVC now finds out of date. The result is added to
``bench/results/pinned_outputs.json`` under this machine's CPU model.

    make run && .venv/bin/python bench/pinned_outputs.py [--rev HEAD]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

RESULT = REPO / "bench" / "results" / "pinned_outputs.json"
TRACE = REPO / "bench" / "results" / "sft_trace.json"
PINNED = {"index": ("indexes/bm25", "indexes/dense"), "sft": ("models/sft",)}  # stage -> its pinned outputs


def out_hashes(lock: dict) -> dict[str, str]:
    """The md5 of every pinned output in a dvc.lock mapping."""
    return {o["path"]: o["md5"] for stage, paths in PINNED.items()
            for o in lock["stages"][stage]["outs"] if o["path"] in paths}  # fmt: skip


def sft_inputs(lock: dict) -> str:
    """A hash of what the sft stage read (its deps' md5 in a dvc.lock): traces compare only under the same."""
    import hashlib

    deps = sorted((d["path"], d.get("md5", "")) for d in lock["stages"]["sft"]["deps"])
    return hashlib.sha256(json.dumps(deps).encode()).hexdigest()[:16]


def first_departure(committed: list[float], here: list[float]) -> int | None:
    """The first optimizer step (0-based) whose loss differs in any bit; None if none does."""
    return next((i for i, (a, b) in enumerate(zip(committed, here)) if a != b), None)


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def check(rev: str) -> dict:
    """This machine's pinned outputs against the committed ones at ``rev``."""
    from bench.portable_numerics import described_machine

    committed = out_hashes(yaml.safe_load(git("show", f"{rev}:dvc.lock")))
    here = out_hashes(yaml.safe_load((REPO / "dvc.lock").read_text()))
    sft_then = json.loads(git("show", f"{rev}:metrics/sft.json"))
    sft_now = json.loads((REPO / "metrics" / "sft.json").read_text())
    from flows.plan import dvc_status

    stale = sorted(dvc_status(REPO, "paper/dvc.yaml"))
    return {
        "machine": described_machine(),
        "against": git("rev-parse", "--short", rev),
        "outputs": {path: {"committed": md5[:8], "here": here[path][:8], "same": md5 == here[path]}
                    for path, md5 in committed.items()},
        "sft_loss_departs_at_step": first_departure(sft_then["nll"], sft_now["nll"]),
        "sft_loss": {"committed": sft_then["nll"], "here": sft_now["nll"]},
        "paper_stages_out_of_date": len(stale),
        "paper_stages_out_of_date_examples": stale[:3],
    }


def trace() -> dict:
    """The sft stage's training again (pinned, same inputs), with each micro-batch's loss bits and
    the weights' hash after each optimizer step."""
    from agent_r1.stages.common import checked_index, pin_portable_numerics

    pin_portable_numerics()
    import hashlib
    import struct
    import tempfile

    import torch

    from agent_r1.config import load_params
    from agent_r1.data.schema import read_questions
    from agent_r1.training import sft

    steps: list[dict] = [{"losses": []}]
    make_trainable = sft.make_trainable

    def recorded(*args: object, **kwargs: object) -> object:
        engine = make_trainable(*args, **kwargs)
        backward, step = engine.backward, engine.step

        def record_backward(loss: torch.Tensor) -> None:
            steps[-1]["losses"].append(struct.pack("<f", loss.item()).hex())
            backward(loss)

        def record_step() -> None:
            step()
            steps[-1]["grad_norm"] = struct.pack("<f", float(engine.get_global_grad_norm())).hex()
            weights = b"".join(p.detach().numpy().tobytes() for p in engine.module.parameters())
            steps[-1]["weights"] = hashlib.sha256(weights).hexdigest()[:16]
            steps.append({"losses": []})

        engine.backward, engine.step = record_backward, record_step
        return engine

    sft.make_trainable = recorded
    params = load_params(REPO / "params.yaml")
    env_params = params.model_copy(update={"env": params.env.model_copy(update={"one_shot": params.sft.one_shot})})
    with tempfile.TemporaryDirectory() as tmp:
        sft.train_sft(env_params, init_model=REPO / "models" / "policy",
                      index_path=checked_index(params, REPO / "indexes"),
                      train_questions=read_questions(REPO / "data" / "prepared" / "train.parquet").to_dict("records"),
                      out_model=Path(tmp) / "sft")  # fmt: skip
    from bench.portable_numerics import described_machine

    lock = yaml.safe_load((REPO / "dvc.lock").read_text())
    return {"machine": described_machine(), "rev": git("rev-parse", "--short", "HEAD"),
            "sft_inputs": sft_inputs(lock), "steps": steps[:-1]}  # fmt: skip


def machine_key(machine: dict) -> str:
    """A result's key: the CPU model and its widest vector unit, since one model name
    ("AMD EPYC") covers CPUs with and without AVX-512, whose kernels differ."""
    return f"{machine['cpu']}, {'AVX-512' if 'avx512f' in machine.get('isa', []) else 'AVX2'}"


def first_trace_difference(a: list[dict], b: list[dict]) -> str | None:
    """Where two traces first differ: a micro-batch's loss, the clipping norm, or the weights after a step."""
    for i, (x, y) in enumerate(zip(a, b)):
        for j, (lx, ly) in enumerate(zip(x["losses"], y["losses"])):
            if lx != ly:
                return f"step {i}, micro-batch {j}: loss"
        if x.get("grad_norm") != y.get("grad_norm"):
            return f"step {i}: the gradient norm"
        if x["weights"] != y["weights"]:
            return f"step {i}: the weights after the update"
    return None


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="the commit whose dvc.lock is the reference")
    p.add_argument("--trace", action="store_true", help="record the warm start's training step by step")
    args = p.parse_args(argv)
    if args.trace:
        result = trace()
        traces = json.loads(TRACE.read_text()) if TRACE.exists() else {}
        for cpu, other in traces.items():
            if cpu == machine_key(result["machine"]):
                continue
            if other.get("sft_inputs") != result["sft_inputs"]:
                print(f"against {cpu}: recorded at {other['rev']} with other sft inputs; not compared")
                continue
            print(f"against {cpu}: {first_trace_difference(other['steps'], result['steps']) or 'the same'}")
        TRACE.write_text(json.dumps({**traces, machine_key(result["machine"]): result}, indent=2) + "\n")
        print(f"-> {TRACE.relative_to(REPO)}")
        return
    result = check(args.rev)
    for path, o in result["outputs"].items():
        print(f"{path:<15} committed {o['committed']}  here {o['here']}  {'the same' if o['same'] else 'DIFFERENT'}")
    step = result["sft_loss_departs_at_step"]
    print(f"sft loss: {'the same at every step' if step is None else f'first differs at optimizer step {step}'}")
    print(f"paper/dvc.yaml: {result['paper_stages_out_of_date']} stage(s) out of date here")
    everything = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    everything[machine_key(result["machine"])] = result
    RESULT.write_text(json.dumps(everything, indent=2) + "\n")
    print(f"-> {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
