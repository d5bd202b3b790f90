"""Greedy evaluation on the test split: a policy in the ToolEnv, and Naive RAG.

*Base Tool Call* is :func:`play_policy` on the untrained model; any
checkpoint (a transformers folder) is evaluated the same way. Both return one
row per question; :func:`agent_r1.evaluation.summary.summarize_episodes` summarises
them and :func:`~agent_r1.evaluation.summary.write_outcomes` keeps them.
"""

from __future__ import annotations

import logging
import random
import re
from pathlib import Path
from typing import Any

import pandas as pd
from tqdm import tqdm

from agent_r1.config import Params
from agent_r1.env.rewards import exact_match, f1_score
from agent_r1.retrieval.base import SearchIndex

log = logging.getLogger(__name__)

NAIVE_RAG_SYSTEM = (
    "Answer the question using the documents. Reply with only the answer, "
    "inside <answer> and </answer>, for example <answer>Paris</answer>."
)
_ANSWER = re.compile(r"<answer>(.*?)(?:</answer>|$)", re.S)


def select_questions(test: pd.DataFrame, per_source: int | None, seed: int) -> list[dict[str, Any]]:
    """At most ``per_source`` questions of each source, a seeded sample: every
    method is scored on exactly the same questions."""
    parts = []
    for _, group in test.groupby("source", sort=True):
        n = len(group) if per_source is None else min(per_source, len(group))
        parts.append(group.sample(n=n, random_state=seed).sort_values("id"))
    return pd.concat(parts).to_dict("records") if parts else []


def validation_questions(val: pd.DataFrame, total: int, seed: int) -> list[dict[str, Any]]:
    """The in-training evals' questions: ``total`` (train.eval_questions) spread evenly over
    the validation split's sources, at least one of each."""
    return select_questions(val, max(1, total // max(val["source"].nunique(), 1)), seed)


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i : i + size]


def play_policy(
    model_path: Path, index: SearchIndex | None, records: list[dict[str, Any]], params: Params, method: str
) -> list[dict[str, Any]]:
    """Greedy multi-turn episodes of the policy at ``model_path`` in the env of ``params``: one info
    dict per record (``index``: the agent's search index, None for an env that searches none)."""
    from agent_r1.env import make_env
    from agent_r1.rollout import make_rollout_engine, run_episodes

    engine = make_rollout_engine(model_path, params.rollout)
    env = make_env(params, index=index)
    infos: list[dict[str, Any]] = []
    chunk = max(1, params.rollout.batch_size)
    for batch in tqdm(list(_chunks(records, chunk)), desc=f"evaluate {method}", unit="batch"):
        traj = run_episodes(engine, env, engine.tokenizer, batch, params.rollout, greedy=True)
        infos.extend(traj.info)
    return infos


def play_random(records: list[dict[str, Any]], params: Params, seed: int) -> list[dict[str, Any]]:
    """A stateful env's random baseline: every turn a call drawn uniformly from the actions legal
    then (:meth:`AgentEnv.random_call <agent_r1.env.agent_env.AgentEnv.random_call>`), played
    through the same env, turn limit and metrics as a policy. One info dict per record."""
    from agent_r1.env import make_env
    from agent_r1.env.agent_env import AgentEnvRunner

    env = make_env(params)
    if not isinstance(env, AgentEnvRunner):
        raise ValueError("the random baseline plays a stateful env (env.name); the QA task has Naive RAG")
    rng = random.Random(seed)
    infos = []
    for record in tqdm(records, desc="evaluate random", unit="episode"):
        episode = env.reset(record)
        while not episode.done:
            call = episode.tools["env"].random_call(rng)
            if call is None:
                env.release([episode])
                raise ValueError(f"env.name {params.env.name!r}: its env does not say which actions are legal "
                                 "(AgentEnv.random_call), so it has no random baseline")
            env.step_batch([episode], [env.format.render_call(call)])
        infos.append({**episode.metrics, "question_id": record["id"], "source": record["source"],
                      "type": record["type"]})
    return infos


# One worked example, as the tool-calling agent gets one: a fair baseline, not a strawman.
NAIVE_RAG_EXAMPLE = [
    {"role": "user", "content": "Documents:\nDoc 1 (Velmora Labs): Velmora Labs is a robotics company founded "
                                "by Ilsa Brandt.\n\nQuestion: Who founded Velmora Labs?"},
    {"role": "assistant", "content": "<answer>Ilsa Brandt</answer>"},
]


def naive_rag_prompt(question: str, hits: list, doc_chars: int) -> list[dict[str, str]]:
    docs = "\n".join(f"Doc {i} ({h.title}): {h.text[:doc_chars]}" for i, h in enumerate(hits, 1))
    return [
        {"role": "system", "content": NAIVE_RAG_SYSTEM},
        *NAIVE_RAG_EXAMPLE,
        {"role": "user", "content": f"Documents:\n{docs}\n\nQuestion: {question}"},
    ]


def extract_answer(text: str) -> str:
    """The ``<answer>`` content if the model used the tags, else its first non-empty line."""
    m = _ANSWER.search(text)
    if m:
        return m.group(1).strip()
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def play_naive_rag(
    model_path: Path, index: SearchIndex, records: list[dict[str, Any]], params: Params, max_new_tokens: int = 48
) -> list[dict[str, Any]]:
    """Retrieve top-k with the whole question, answer in one turn (no tool use): one row per record."""
    from agent_r1.rollout import make_rollout_engine

    engine = make_rollout_engine(model_path, params.rollout)
    tok = engine.tokenizer
    rows: list[dict[str, Any]] = []
    chunk = max(1, params.rollout.batch_size)
    for batch in tqdm(list(_chunks(records, chunk)), desc="evaluate naive_rag", unit="batch"):
        hits = index.search([r["question"] for r in batch], params.env.top_k)
        prompts = [
            tok.apply_chat_template(
                naive_rag_prompt(r["question"], h, params.env.doc_chars), add_generation_prompt=True, tokenize=True
            )
            for r, h in zip(batch, hits)
        ]
        prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
        outs = engine.generate(prompts, max_new_tokens, temperature=0.0, stop_strings=["</answer>"])
        for r, out in zip(batch, outs):
            answer = extract_answer(tok.decode(out.token_ids, skip_special_tokens=True))
            golds = list(r["answers"])
            rows.append(
                {
                    "id": r["id"],
                    "source": r["source"],
                    "type": r["type"],
                    "answer": answer,
                    "em": exact_match(answer, golds),
                    "f1": f1_score(answer, golds),
                    "answered": bool(answer),
                    "turns": 1,
                    "tool_calls": 0,
                    "invalid_calls": 0,
                    "termination": "answer" if answer else "no_action",
                }
            )
    return rows
