"""What every stage entry point shares: logging set-up and params validation first."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params, ParamsError, load_params, with_presets
from agent_r1.data.schema import SchemaError
from agent_r1.io import clean_scratch


def run_stage(
    name: str,
    body: Callable[..., None],
    argv: list[str] | None = None,
    experiment_arg: bool = False,
    extra_experiments: tuple[str, ...] = (),
) -> None:
    """Validate params (fail fast, naming the key), then run ``body(params)``,
    or ``body(params, experiment)`` for the per-experiment stages.

    Exit code 2 on bad params, or on input data that breaks the schema, so
    DVC/Prefect report the stage as failed without a traceback burying the message.
    """
    parser = argparse.ArgumentParser(prog=f"agent_r1.stages.{name}")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument(
        "--presets", default=None,
        help="a presets file (paper/presets.yaml): its experiments replace params.yaml's, "
        "and their outputs go under the file's folder",
    )
    if experiment_arg:
        parser.add_argument("--experiment", required=True, help="a key of `experiments` in params.yaml")
    # the deepspeed launcher passes each rank --local_rank (train.num_procs > 1); LOCAL_RANK says the same
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [{name}] %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    clean_scratch()  # temp leftovers of a stage killed mid-write (OOM, kill -9); never a live one's
    try:
        params = load_params(args.params)
        if args.presets is not None:
            params = with_presets(params, args.presets)
            paths.set_experiment_root(Path(args.presets).parent)
        if experiment_arg and args.experiment not in (*params.experiments, *extra_experiments):
            raise ParamsError(args.presets or args.params, [f"experiments.{args.experiment}: no such experiment"])
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    try:
        body(params, args.experiment) if experiment_arg else body(params)
    except SchemaError as exc:  # bad data (a prepared parquet, an official file): the file and problem, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
