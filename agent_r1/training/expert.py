"""A scripted expert policy for the warm start.

It plays the gold plan of a question — one search per hop with the gold
sub-query, then the canonical answer — through the *same* rollout loop and
environment as the learned policy. So the demonstrations are TrajectoryBatches
with token-exact action masks and real search observations, and the SFT loss
is the masked negative log-likelihood of the expert's action tokens.

It is an engine (token ids in, token ids out) that reads the conversation like
a policy would: it finds which question the prompt is about and answers with
the next action of that question's plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from agent_r1.env.formats import ToolCall, get_format
from agent_r1.env.tools import SearchTool
from agent_r1.rollout.engine import GenerationEngine, GenerationOutput


def expert_plan(record: dict[str, Any], fmt_name: str) -> list[str]:
    """The gold actions of a record: search each sub-query, then answer, written as the
    action format ``fmt_name`` (``env.format``) writes them."""
    fmt = get_format(fmt_name)  # without tools: the search tool's shape, all the expert uses
    # parquet gives numpy arrays: test emptiness by length, not truthiness
    sub_queries = record.get("sub_queries")
    hops = sub_queries if sub_queries is not None and len(sub_queries) else record["supporting_titles"]
    calls = [fmt.render_call(ToolCall(SearchTool.name, {"query": str(q)})) for q in hops]
    return [*calls, fmt.render_answer(str(list(record["answers"])[0]))]


def plan_of(env: Any) -> Callable[[dict[str, Any]], list[str]]:
    """How the expert plays in ``env``: a stateful env's own plan (a game's walkthrough), else the QA plan."""
    from agent_r1.env.agent_env import AgentEnvRunner

    if isinstance(env, AgentEnvRunner):
        return env.expert_plan
    return lambda record: expert_plan(record, env.cfg.format)


class ExpertEngine(GenerationEngine):
    """Plays ``plan`` (:func:`plan_of` the env) for each record. One instance per ``run_episodes``
    call with ``rollout.n == 1``: it counts the turns it has played for each question."""

    def __init__(self, tokenizer: Any, records: Sequence[dict[str, Any]], plan: Callable[[dict[str, Any]], list[str]]):
        self.tokenizer = tokenizer
        self.plans = {str(r["question"]).strip(): plan(r) for r in records}
        # Longest question first: one question may be a prefix of another.
        self._questions = sorted(self.plans, key=len, reverse=True)
        self.turns_played: dict[str, int] = {q: 0 for q in self.plans}

    def _question_of(self, prompt_text: str) -> str:
        for q in self._questions:
            if q in prompt_text:
                return q
        raise KeyError("the expert was asked about a question it has no plan for")

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int] | int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_strings: Sequence[str] = (),
        seed: int | None = None,
    ) -> list[GenerationOutput]:
        outs = []
        limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        for prompt, limit in zip(prompts, limits, strict=True):
            q = self._question_of(self.tokenizer.decode(prompt, skip_special_tokens=False))
            plan, turn = self.plans[q], self.turns_played[q]
            self.turns_played[q] += 1
            action = plan[min(turn, len(plan) - 1)]
            ids = self.tokenizer.encode(action, add_special_tokens=False)
            finish = "stop" if len(ids) <= limit else "length"
            ids = ids[:limit]
            outs.append(GenerationOutput(token_ids=ids, logprobs=[0.0] * len(ids), finish_reason=finish))
        return outs
