"""Answer scoring (SQuAD EM/F1), the outcome reward and the process rewards.

Exact formulas (``s`` = answer score: EM or F1 per ``answer_metric``, max over
the gold aliases, 0 when there is no answer; ``f`` = ``format_score``;
``valid`` = the episode ended with a well-formed ``<answer>`` turn):

* ``paper`` (default):            ``s``            if valid, else ``f - 1``
* ``answer_only``:                ``s``
* ``answer_plus_format``:         ``s + f``        if valid, else ``s`` (= 0)

Each is a function here (:func:`paper_reward`, ...) registered by name in
``agent_r1.registry.REWARDS``; ``env.reward.scheme`` names one, or a user's own
``package.module:fn`` with the same signature
``fn(answer, golds, format_valid, cfg) -> float`` (``answer`` is None when the
episode never answered; ``cfg`` is the whole ``env.reward`` group). A scheme
with settings of its own declares them as ``fn.Options`` (a model derived from
``agent_r1.config.PluginOptions``) and takes them as ``options``: ``env.reward.options``
validated (the built-ins take none).

``paper`` is Agent-R1's released QA reward (``compute_score_format_answer``:
``-1 + format + answer`` when the format reward is full, else ``-1 + format``),
with its partial format credit reduced to the constant ``f`` because our env
judges validity per episode, not per turn. A valid but wrong answer gets 0,
never less; an episode that never answers gets ``f - 1`` (-0.9 by default),
so answering always beats not answering. Malformed intermediate turns do not
void the outcome here; they cost ``invalid_call`` each as process reward.

Process reward of one turn (raw, before :func:`finalize_process_rewards`)::

    valid_call * (well-formed calls) + (the tools' own process rewards for
    their results of the turn) + invalid_call * (malformed turns + calls that
    failed validation, raised or timed out)

where the built-in search tool's own reward is ``new_support_doc * (supporting
titles surfaced for the first time in the episode)``
(:meth:`agent_r1.env.tools.SearchTool.process_reward`) and a tool without one
adds 0.

and :func:`finalize_process_rewards` then (1) if ``only_if_answered`` and the
episode did not answer, sets every positive turn reward to 0 (negative ones
stay: a never-answering episode can only lose by its malformed calls); (2) if
the positive turn rewards sum to more than ``cap``, scales them all by
``cap / sum`` (scaling, not clipping, so late turns keep their share of the
credit). Without (1) and (2) the policy learned to search every
turn and never answer.
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import TYPE_CHECKING, Any

from agent_r1.config import ProcessRewardConfig, RewardConfig
from agent_r1.data.answers import normalize_answer
from agent_r1.registry import REWARDS

if TYPE_CHECKING:
    from agent_r1.env.episode import Episode


def exact_match(pred: str, golds: list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold alias, else 0.0."""
    p = normalize_answer(pred)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not pred_tokens or not gold_tokens:  # SQuAD: an empty side scores only against another empty side
        return float(pred_tokens == gold_tokens)
    same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(pred: str, golds: list[str]) -> float:
    """SQuAD token F1 of the prediction, max over gold aliases (0.0 with no golds)."""
    p = normalize_answer(pred).split()
    return max((_f1(p, normalize_answer(g).split()) for g in golds), default=0.0)


def answer_score(answer: str | None, golds: list[str], metric: str) -> float:
    """EM or F1 of the answer; 0.0 when there is none."""
    if answer is None:
        return 0.0
    if metric == "em":
        return exact_match(answer, golds)
    if metric == "f1":
        return f1_score(answer, golds)
    raise ValueError(f"unknown answer metric {metric!r}; expected 'em' or 'f1'")


def paper_reward(answer: str | None, golds: list[str], format_valid: bool, cfg: RewardConfig) -> float:
    """``s`` if ``format_valid``, else ``format_score - 1`` (``s`` = :func:`answer_score` by ``cfg.answer_metric``)."""
    return answer_score(answer, golds, cfg.answer_metric) if format_valid else cfg.format_score - 1.0


def answer_only_reward(answer: str | None, golds: list[str], format_valid: bool, cfg: RewardConfig) -> float:
    """``s``, whatever the format (``s`` = :func:`answer_score` by ``cfg.answer_metric``)."""
    del format_valid  # the scheme ignores it by definition
    return answer_score(answer, golds, cfg.answer_metric)


def answer_plus_format_reward(answer: str | None, golds: list[str], format_valid: bool, cfg: RewardConfig) -> float:
    """``s + format_score`` if ``format_valid``, else ``s`` (= 0: no valid answer turn, no answer)."""
    return answer_score(answer, golds, cfg.answer_metric) + (cfg.format_score if format_valid else 0.0)


def outcome_reward(
    answer: str | None, golds: list[str], format_valid: bool, cfg: RewardConfig, episode: Episode | None = None
) -> float:
    """The episode's outcome reward: the function ``cfg.scheme`` names in the REWARDS registry.

    Called by keyword, the names the registry checks a plugin's signature for; a scheme that
    declares ``Options`` also gets ``options``: ``cfg.options`` validated by them. A scheme with
    an argument named ``episode`` gets the whole :class:`~agent_r1.env.episode.Episode`: every
    turn's messages, the record, and its per-episode tools still open (``episode.tools``), for a
    task whose success is a state (a file the interpreter wrote) rather than the answer string.
    """
    scheme = REWARDS.load(cfg.scheme)
    options = REWARDS.options(cfg.scheme, cfg.options)
    own: dict[str, Any] = {} if options is None else {"options": options}  # only a scheme with Options takes them
    if "episode" in inspect.signature(scheme).parameters:
        own["episode"] = episode
    return float(scheme(answer=answer, golds=golds, format_valid=format_valid, cfg=cfg, **own))


def turn_process_reward(valid_calls: int, tool_reward: float, invalid_calls: int, cfg: ProcessRewardConfig) -> float:
    """The raw process reward of one turn (before the episode-level :func:`finalize_process_rewards`):
    ``valid_calls * valid_call + tool_reward + invalid_calls * invalid_call``, ``tool_reward`` being
    the sum of the tools' own process rewards for the turn (:meth:`agent_r1.env.tools.Tool.process_reward`)."""
    if not cfg.enabled:
        return 0.0
    return valid_calls * cfg.valid_call + tool_reward + invalid_calls * cfg.invalid_call


def finalize_process_rewards(turn_rewards: list[float], answered: bool, cfg: ProcessRewardConfig) -> list[float]:
    """Apply ``only_if_answered`` then ``cap`` (by scaling) to the per-turn process rewards of one episode."""
    if not cfg.enabled:
        return [0.0] * len(turn_rewards)
    out = [float(r) for r in turn_rewards]
    if cfg.only_if_answered and not answered:
        out = [min(r, 0.0) for r in out]
    positive = sum(r for r in out if r > 0)
    if positive > cfg.cap:
        scale = cfg.cap / positive
        out = [r * scale if r > 0 else r for r in out]
    return out
