"""What every stage entry point shares: logging set-up, params validation first, and path arguments."""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

from agent_r1.config import Params, ParamsError, load_params, plugin_problems, with_presets, with_sets
from agent_r1.data.schema import SchemaError
from agent_r1.io import clean_scratch


def checked_index(params: Params, indexes: Path, required: bool = False) -> Path | str | None:
    """Where the agent's search index is (a folder in ``indexes`` or a server URL), checked before
    any work; None when the env searches none (:func:`agent_r1.env.make.needs_index`) and the
    caller does not read it itself (``required``: Naive RAG does)."""
    from agent_r1 import paths
    from agent_r1.env.make import needs_index
    from agent_r1.retrieval import check_index

    if not (required or needs_index(params)):
        return None
    retrieval = params.retrieval
    location = paths.index_location(retrieval.index, indexes, retrieval.url)
    check_index(location, "retrieval.url" if retrieval.url else "retrieval.index", kind=retrieval.index)
    return location


def add_path_arguments(parser: argparse.ArgumentParser, body: Callable[..., None]) -> list[str]:
    """One ``--name`` option per keyword-only parameter of ``body`` (underscores as dashes),
    defaulting to the parameter's own default: the stage function is the one place that
    says which paths a stage reads and writes, and where they are unless given."""
    names = []
    for p in inspect.signature(body).parameters.values():
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            shown = "see above" if p.default is None else str(p.default)  # the stage's docstring says
            parser.add_argument(
                f"--{p.name.replace('_', '-')}", dest=p.name, type=Path, default=p.default, metavar="PATH",
                help=f"default: {shown}",
            )
            names.append(p.name)
    return names


def stage_parser(
    name: str, body: Callable[..., None], experiment_arg: bool = False
) -> tuple[argparse.ArgumentParser, list[str]]:
    """The stage's command line, and the names of its path arguments."""
    parser = argparse.ArgumentParser(prog=f"agent_r1.stages.{name}", description=inspect.getdoc(body))
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument(
        "--presets", default=None,
        help="a presets file (paper/presets.yaml): its experiments replace params.yaml's",
    )
    if experiment_arg:
        parser.add_argument("--experiment", required=True, help="a key of `experiments` in params.yaml")
        parser.add_argument(
            "--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
            help="change one param of this experiment, last (train.seed=1; VALUE is YAML); repeatable",
        )
    # the deepspeed launcher passes each rank --local_rank (train.num_procs > 1); LOCAL_RANK says the same
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser, add_path_arguments(parser, body)


# The settings under which a stage's floating point comes out the same on every x86-64 CPU
# model, Intel or AMD, AVX2 or AVX-512 (with the same number of threads): PyTorch's own
# kernels at one vector width, MKL's GEMM on the one branch its vendor documents as
# identical across vendors (SSE2; the AVX2 branch is Intel-only), oneDNN capped to match.
# Only for the stages whose outputs everything downstream is keyed on (the indexes, the
# warm start): the slow GEMM costs them ~3-4x in model time, and their bytes then stay
# the same when the pipeline is rebuilt on another machine. Costs in the README.
PORTABLE_CPU_NUMERICS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def pin_portable_numerics() -> None:
    """Set :data:`PORTABLE_CPU_NUMERICS` for this process; before torch is imported, as
    PyTorch and MKL read them once, at their first use."""
    if "torch" in sys.modules:
        raise RuntimeError("pin_portable_numerics() must run before torch is imported")
    os.environ.update(PORTABLE_CPU_NUMERICS)


def run_stage(
    name: str,
    body: Callable[..., None],
    argv: list[str] | None = None,
    experiment_arg: bool = False,
    extra_experiments: tuple[str, ...] = (),
    portable_numerics: bool = False,
) -> None:
    """Validate params (fail fast, naming the key), then run ``body(params, **paths)``,
    or ``body(params, experiment, **paths)`` for the per-experiment stages, ``paths``
    being the keyword-only parameters of ``body`` as given on the command line.

    Exit code 2 on bad params, or on input data that breaks the schema, so
    DVC/Prefect report the stage as failed without a traceback burying the message.
    ``portable_numerics``: :func:`pin_portable_numerics` first.
    """
    if portable_numerics:
        pin_portable_numerics()
    parser, path_names = stage_parser(name, body, experiment_arg)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s [{name}] %(levelname)s %(message)s", datefmt="%H:%M:%S"
    )
    clean_scratch()  # temp leftovers of a stage killed mid-write (OOM, kill -9); never a live one's
    params = _checked_params(args, experiment_arg, extra_experiments)
    paths = {n: getattr(args, n) for n in path_names}
    try:
        body(params, args.experiment, **paths) if experiment_arg else body(params, **paths)
    except SchemaError as exc:  # bad data (a prepared parquet, an official file): the file and problem, no traceback
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)


def _checked_params(args: argparse.Namespace, experiment_arg: bool, extra_experiments: tuple[str, ...]) -> Params:
    """``--params`` (with ``--presets``' experiments), the experiment checked; exit 2 naming the key if not."""
    try:
        params = load_params(args.params)
        if args.presets is not None:
            params = with_presets(params, args.presets)
        if experiment_arg and args.experiment not in (*params.experiments, *extra_experiments):
            raise ParamsError(args.presets or args.params, [f"experiments.{args.experiment}: no such experiment"])
        if experiment_arg and args.sets:
            params = with_sets(params, args.experiment, args.sets)
        if problems := plugin_problems(params):
            raise ParamsError(args.params, problems)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        sys.exit(2)
    return params
