"""baselines stage: the untrained policy in the env (Base Tool Call), and the task's baseline
without a policy: Naive RAG for the QA task, a random legal action for a stateful env."""

from __future__ import annotations

import logging
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import write_json
from agent_r1.stages.common import checked_index, run_stage

log = logging.getLogger(__name__)


def baselines(
    params: Params,
    *,
    policy: Path = paths.POLICY_DIR,
    indexes: Path = paths.INDEX_DIR,
    test_questions: Path = paths.TEST_QUESTIONS,
    naive_rag: Path = paths.EVAL_METRICS_DIR / "naive_rag.json",
    base_tool_call: Path = paths.EVAL_METRICS_DIR / "base_tool_call.json",
    naive_rag_outcomes: Path = paths.OUTCOMES_DIR / "naive_rag.jsonl",
    base_tool_call_outcomes: Path = paths.OUTCOMES_DIR / "base_tool_call.jsonl",
    random: Path = paths.EVAL_METRICS_DIR / "random.json",
    random_outcomes: Path = paths.OUTCOMES_DIR / "random.jsonl",
) -> None:
    """With ``env.name`` (a stateful env) the random baseline goes to ``random``, else Naive RAG
    to ``naive_rag``; Base Tool Call to ``base_tool_call`` either way."""
    from agent_r1.data.schema import read_questions
    from agent_r1.evaluation.greedy import play_naive_rag, play_policy, play_random, select_questions
    from agent_r1.retrieval import load_index

    location = checked_index(params, indexes, required=params.env.name is None)  # Naive RAG reads it
    records = select_questions(
        read_questions(test_questions), params.eval.questions_per_source, params.eval.seed
    )
    index = load_index(location) if location is not None else None
    if params.env.name is not None:
        log.info("Random legal actions on %d test episodes", len(records))
        _write("random", play_random(records, params, params.eval.seed), random, random_outcomes)
    else:
        log.info("Naive RAG on %d test questions", len(records))
        rows = play_naive_rag(policy, index, records, params, params.eval.naive_rag_max_new_tokens)
        _write("naive_rag", rows, naive_rag, naive_rag_outcomes)
    log.info("Base Tool Call on %d test questions", len(records))
    _write("base_tool_call", play_policy(policy, index, records, params, "base_tool_call"), base_tool_call,
           base_tool_call_outcomes)


def _write(method: str, rows: list[dict], metrics: Path, outcomes: Path) -> None:
    from agent_r1.evaluation.summary import summarize_episodes, write_outcomes

    result = summarize_episodes(rows, method)
    write_json(metrics, result)
    write_outcomes(outcomes, rows)
    log.info("%s: EM %.4f F1 %.4f answer rate %.3f", method, result["em"], result["f1"], result["answer_rate"])


if __name__ == "__main__":
    run_stage("baselines", baselines)
