"""``agent-r1`` command line. Heavy imports happen inside each command so that
``agent-r1 params check`` answers in well under a second."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from agent_r1.config import Params


def _params_check(args: argparse.Namespace) -> int:
    from agent_r1.config import ParamsError, load_params, plugin_problems, with_presets

    try:
        params = load_params(args.file)
        if args.presets is not None:
            params = with_presets(params, args.presets)
        if problems := plugin_problems(params):
            raise ParamsError(args.file, problems)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    print(f"{args.file}{f' with {args.presets}' if args.presets else ''}: ok")
    return 0


def _plan(args: argparse.Namespace) -> int:
    """Each rank's memory for a params file against the device's; exit 2 naming the keys to change."""
    from agent_r1.config import ParamsError, load_params
    from agent_r1.memory_plan import PlanError, find_device, model_arch, plan

    try:
        params = load_params(args.file)
        arch = model_arch(params, args.model_config)
        device = find_device(args.gpus, args.gpu_memory_gib, args.cpu_memory_gib)
        report, errors = plan(params, arch, device, args.file, args.experiment)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report)
    if errors:
        print("\n".join(errors), file=sys.stderr)
        return 2
    return 0


def _downloaded_names() -> list[str]:
    """The built-in data sources that read a downloaded file (registry metadata: nothing imported)."""
    from agent_r1.registry import DATA_SOURCES

    return [n for n in DATA_SOURCES.names() if DATA_SOURCES.meta(n, "downloads", False)]


def _data_convert(args: argparse.Namespace) -> int:
    from agent_r1.data.official import convert_file

    try:
        n_q, n_d = convert_file(args.source, Path(args.input), Path(args.out))
    except ValueError as exc:  # a bad file (OfficialFormatError) or a source that reads no file
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {n_q} questions and {n_d} documents to {args.out}")
    return 0


def _index_arg(args: argparse.Namespace, params: Params | None = None) -> str | Path:
    """``--index`` as given, else where ``--params`` says the agent searches (retrieval.url or indexes/<retrieval.index>)."""
    from agent_r1.config import load_params
    from agent_r1.paths import index_location

    if args.index is not None:
        return args.index
    retrieval = (params or load_params(args.params)).retrieval
    return index_location(retrieval.index, url=retrieval.url)


def _search(args: argparse.Namespace) -> int:
    from agent_r1.config import ParamsError
    from agent_r1.retrieval import IndexFormatError, load_index
    from agent_r1.retrieval.client import RetrievalServerError

    try:
        index = load_index(_index_arg(args))
        results = index.search(list(args.query), args.top_k)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    except (IndexFormatError, RetrievalServerError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for query, hits in zip(args.query, results):
        if args.json:
            print(json.dumps({"query": query, "hits": [h.to_dict() for h in hits]}))
            continue
        print(f"== {query}")
        for rank, h in enumerate(hits, 1):
            print(f"{rank:>3}. [{h.score:7.3f}] {h.title} ({h.doc_id})\n     {h.text[:200]}")
    return 0


def _serve(args: argparse.Namespace) -> int:
    import logging

    from agent_r1.retrieval.server import serve

    logging.basicConfig(level=logging.INFO, format="%(asctime)s [serve] %(levelname)s %(message)s", datefmt="%H:%M:%S")
    serve(args.index, host=args.host, port=args.port)
    return 0


def _chat(args: argparse.Namespace) -> int:
    """One episode of a policy in the ToolEnv, printed span by span with masks and rewards."""
    from agent_r1.config import ParamsError, load_params
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine, run_episodes
    from agent_r1.rollout.inspect import render

    try:
        params = load_params(args.params)
    except ParamsError as exc:
        print(exc, file=sys.stderr)
        return 2
    if args.one_shot is not None:
        params = params.model_copy(update={"env": params.env.model_copy(update={"one_shot": args.one_shot})})
    engine = make_rollout_engine(args.model, params.rollout)
    env = make_env(params, _index_arg(args, params))
    record = {"id": "chat", "question": args.question, "answers": args.answer or [""],
              "supporting_titles": [], "type": "chat", "source": "chat"}
    rollout = params.rollout.model_copy(update={"n": 1, "seed": args.seed})
    batch = run_episodes(engine, env, engine.tokenizer, [record], rollout, greedy=not args.sample)
    print(render(batch, 0, engine.tokenizer))
    return 0


def _compare(args: argparse.Namespace) -> int:
    from agent_r1.compare import CompareError, collect, render

    try:
        rows = collect(args.a, args.b, all_rows=args.all)
    except CompareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(render(rows, args.a, args.b))
    return 0


def _add_plan(sub: Any) -> None:
    plan = sub.add_parser(
        "plan", help="estimate each rank's memory (weights, optimizer, activations, KV cache) against the device's",
        description="Per rank: the training state under train.zero_stage, the reference and the critic, the "
        "activations at train.micro_batch_tokens, the rollout engine's weights and KV cache, against one "
        "device's memory. Nothing is loaded. Exit 2, naming the params keys to change, when it does not fit.",
    )
    plan.add_argument("file", nargs="?", default="params.yaml")
    plan.add_argument("--experiment", default=None, help="plan this experiment only (default: each)")
    plan.add_argument("--gpus", type=int, default=None, help="GPUs for the run (one rank each)")
    plan.add_argument("--gpu-memory-gib", type=float, default=None, help="memory of each GPU, GiB (e.g. 80)")
    plan.add_argument("--cpu-memory-gib", type=float, default=None,
                      help="plan CPU ranks sharing this much RAM (default without flags: the CUDA devices here, "
                      "else this machine's RAM)")
    plan.add_argument("--model-config", type=Path, default=None, metavar="PATH",
                      help="the model's config.json (or its folder): for a hub id model.path with no built-in shape")
    plan.set_defaults(func=_plan)


def _add_chat(sub: Any) -> None:
    chat = sub.add_parser("chat", help="run one episode and print it with masks and rewards")
    chat.add_argument("question")
    chat.add_argument("--model", default="models/policy", help="a transformers folder (e.g. models/trained/grpo)")
    chat.add_argument("--index", default=None, help="index folder or http(s):// URL (default: retrieval.url, else indexes/<retrieval.index>)")
    chat.add_argument("--params", default="params.yaml")
    chat.add_argument("--answer", action="append", help="gold answer(s), to score the episode")
    chat.add_argument("--sample", action="store_true", help="sample at rollout.temperature instead of greedy")
    chat.add_argument("--seed", type=int, default=0)
    shot = chat.add_mutually_exclusive_group()
    shot.add_argument("--one-shot", dest="one_shot", action="store_true", default=None,
                      help="show the one-shot example (the base model needs it)")
    shot.add_argument("--no-one-shot", dest="one_shot", action="store_false",
                      help="no example (trained policies; see sft.one_shot)")
    chat.set_defaults(func=_chat)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="agent-r1", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    params = sub.add_parser("params", help="work with params files").add_subparsers(dest="sub", required=True)
    check = params.add_parser("check", help="validate a params file against the schema")
    check.add_argument("file", nargs="?", default="params.yaml")
    check.add_argument("--presets", default=None, help="and a presets file over it (paper/presets.yaml)")
    check.set_defaults(func=_params_check)
    _add_plan(sub)

    data = sub.add_parser("data", help="data utilities").add_subparsers(dest="sub", required=True)
    conv = data.add_parser("convert", help="convert one official-format file to the normalised schema")
    conv.add_argument("--source", required=True, help=f"a downloaded data source: {', '.join(_downloaded_names())}, "
                      "or a plugin package.module:Name")
    conv.add_argument("--input", required=True, help="the official JSON / JSONL file")
    conv.add_argument("--out", required=True, help="folder for questions.parquet and corpus.parquet")
    conv.set_defaults(func=_data_convert)

    search = sub.add_parser("search", help="query an index (folder or http:// URL)")
    search.add_argument(
        "--index", default=None, help="index folder or http(s):// URL (default: retrieval.url, else indexes/<retrieval.index>, of --params)"
    )
    search.add_argument("--params", default="params.yaml")
    search.add_argument("--top-k", type=int, default=3)
    search.add_argument("--json", action="store_true", help="one JSON line per query")
    search.add_argument("query", nargs="+")
    search.set_defaults(func=_search)

    serve = sub.add_parser("serve", help="serve an index over HTTP (same API as load_index)")
    serve.add_argument("--index", required=True)
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8765)
    serve.set_defaults(func=_serve)
    _add_chat(sub)

    compare = sub.add_parser(
        "compare", help="params and metrics differences between two commits / experiments (dvc params+metrics diff)"
    )
    compare.add_argument("a", nargs="?", default="HEAD", help="a commit, branch, tag or dvc experiment (default HEAD)")
    compare.add_argument("b", nargs="?", default=None, help="another one (default: the workspace)")
    compare.add_argument("--all", action="store_true", help="also the params and metrics that are equal")
    compare.set_defaults(func=_compare)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
