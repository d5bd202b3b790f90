"""baselines stage: Naive RAG and Base Tool Call (the untrained policy in the ToolEnv)."""

from __future__ import annotations

import logging
from pathlib import Path

from agent_r1 import paths
from agent_r1.config import Params
from agent_r1.io import write_json
from agent_r1.stages.common import run_stage

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
) -> None:
    from agent_r1.data.schema import read_questions
    from agent_r1.evaluation.greedy import play_naive_rag, play_policy, select_questions
    from agent_r1.evaluation.summary import summarize_episodes, write_outcomes
    from agent_r1.retrieval import check_index, load_index

    location = paths.index_location(params.retrieval.index, indexes)
    check_index(location)
    records = select_questions(
        read_questions(test_questions), params.eval.questions_per_source, params.eval.seed
    )
    index = load_index(location)
    log.info("Naive RAG on %d test questions", len(records))
    rows = play_naive_rag(policy, index, records, params, params.eval.naive_rag_max_new_tokens)
    rag = summarize_episodes(rows, "naive_rag")
    write_json(naive_rag, rag)
    write_outcomes(naive_rag_outcomes, rows)
    log.info("Naive RAG EM %.4f F1 %.4f", rag["em"], rag["f1"])
    log.info("Base Tool Call on %d test questions", len(records))
    infos = play_policy(policy, index, records, params, "base_tool_call")
    base = summarize_episodes(infos, "base_tool_call")
    write_json(base_tool_call, base)
    write_outcomes(base_tool_call_outcomes, infos)
    log.info("Base Tool Call EM %.4f F1 %.4f answer rate %.3f", base["em"], base["f1"], base["answer_rate"])


if __name__ == "__main__":
    run_stage("baselines", baselines)
