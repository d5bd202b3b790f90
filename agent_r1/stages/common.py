"""What every stage entry point shares: logging set-up and params validation first."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable

from agent_r1.config import Params, ParamsError, load_params


def run_stage(
    name: str,
    body: Callable[..., None],
    argv: list[str] | None = None,
    experiment_arg: bool = False,
    extra_experiments: tuple[str, ...] = (),
) -> None:
    """Validate params (fail fast, naming the key), then run ``body(params)``,
    or ``body(params, experiment)`` for the per-experiment stages.

    Exit code 2 on bad params so DVC/Prefect report the stage as failed
    without a traceback burying the message.
    """
    parser = argparse.ArgumentParser(prog=f"agent_r1.stages.{name}")
    parser.add_argument("--params", default="params.yaml")
    if experiment_arg:
        parser.add_argument("--experiment", required=True, help="a key of `experiments` in params.yaml")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [{name}] %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    try:
        params = load_params(args.params)
        if experiment_arg and args.experiment not in (*params.experiments, *extra_experiments):
            raise ParamsError(args.params, [f"experiments.{args.experiment}: no such experiment"])
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    body(params, args.experiment) if experiment_arg else body(params)
