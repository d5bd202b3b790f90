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
PINNED = {"index": ("indexes/bm25", "indexes/dense"), "sft": ("models/sft",)}  # stage -> its pinned outputs


def out_hashes(lock: dict) -> dict[str, str]:
    """The md5 of every pinned output in a dvc.lock mapping."""
    return {o["path"]: o["md5"] for stage, paths in PINNED.items()
            for o in lock["stages"][stage]["outs"] if o["path"] in paths}  # fmt: skip


def first_departure(committed: list[float], here: list[float]) -> int | None:
    """The first optimizer step (0-based) whose loss differs in any bit; None if none does."""
    return next((i for i, (a, b) in enumerate(zip(committed, here)) if a != b), None)


def stale_paper_stages() -> list[str]:
    """The stages of paper/dvc.yaml DVC finds out of date here."""
    dvc = [sys.executable, "-m", "dvc", "status", "paper/dvc.yaml", "--json"]
    return sorted(json.loads(subprocess.run(dvc, cwd=REPO, capture_output=True, text=True, check=True).stdout or "{}"))


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()


def check(rev: str) -> dict:
    """This machine's pinned outputs against the committed ones at ``rev``."""
    from bench.portable_numerics import described_machine

    committed = out_hashes(yaml.safe_load(git("show", f"{rev}:dvc.lock")))
    here = out_hashes(yaml.safe_load((REPO / "dvc.lock").read_text()))
    sft_then = json.loads(git("show", f"{rev}:metrics/sft.json"))
    sft_now = json.loads((REPO / "metrics" / "sft.json").read_text())
    stale = stale_paper_stages()
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


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rev", default="HEAD", help="the commit whose dvc.lock is the reference")
    args = p.parse_args(argv)
    result = check(args.rev)
    for path, o in result["outputs"].items():
        print(f"{path:<15} committed {o['committed']}  here {o['here']}  {'the same' if o['same'] else 'DIFFERENT'}")
    step = result["sft_loss_departs_at_step"]
    print(f"sft loss: {'the same at every step' if step is None else f'first differs at optimizer step {step}'}")
    print(f"paper/dvc.yaml: {result['paper_stages_out_of_date']} stage(s) out of date here")
    everything = json.loads(RESULT.read_text()) if RESULT.exists() else {}
    everything[result["machine"]["cpu"]] = result
    RESULT.write_text(json.dumps(everything, indent=2) + "\n")
    print(f"-> {RESULT.relative_to(REPO)}")


if __name__ == "__main__":
    main()
