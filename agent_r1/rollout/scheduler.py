"""The multi-turn rollout: episodes -> engine -> env -> ... -> TrajectoryBatch.

Each trajectory is a list of token ids grown by concatenation only:

    prompt ids | turn 0 generated ids | observation 0 ids | turn 1 generated ids | ...

* generated ids are exactly what the engine returned (action_mask 1);
* observation ids are the chat template's *delta*: the text the template adds
  after the assistant turn (its closing ``<|im_end|>`` unless the policy wrote
  it itself, the observation message, the next generation prompt), found by
  rendering the conversation with a placeholder for the assistant content and
  taking what follows the placeholder; only that delta string is tokenised.
  The policy's own tokens are decoded for the env's parser, never re-encoded
  (re-encoding drifts: Agent-R1's training broke on it).

The scheduler plays the episodes; the engine only generates. It resets the
env for every episode, opens a turn session on the engine
(:meth:`~agent_r1.rollout.engine.GenerationEngine.open_turns`) and adds each
prompt; the session generates until some turns end and returns them. Turns
that end together go to ``env.step_batch`` together, so their tool calls run
as one batch; then each episode either continues (the scheduler adds its next
context: everything so far plus the observation) or ends (it is dropped). With
``cfg.continuous`` (default) the session is the engine's own: the transformers
engine keeps each episode's KV cache across turns and refills free slots as
episodes finish (:mod:`agent_r1.rollout.continuous`); otherwise, and for
engines without one, every turn is one ``generate`` call per ``cfg.batch_size``
episodes with their whole history
(:class:`~agent_r1.rollout.engine.TurnByTurnSession`). An episode whose next
turn would have no room under ``cfg.max_total_tokens`` is truncated there and
finished with ``"max_length"``.

An episode's history lives in one place: the env's ``Episode.messages`` holds
the conversation (the template deltas are rendered from it), the scheduler's
:class:`EpisodeRecord` the token ids, masks and logprobs; the engine keeps
only what it caches.

Context management (``env.context``): when older observations are to be
shown shortened, the trajectory above still records the full history (its
metrics and rewards are the episode's), and each turn's context as shown is
recorded too (``TrajectoryBatch.contexts``): the prompt, the actions as
generated, and each observation in full or shortened (its delta rendered from
the env's short text). That context is what the scheduler adds for the next
turn; a caching session keeps what it computed of the unchanged prefix. The
step representation trains on the recorded contexts.

Greedy (evaluation) uses temperature 0 and one sample per record: with n > 1
the samples would be identical copies.

Seeding: a run is reproducible for a given ``cfg.seed`` (and batch layout);
the trainer varies ``cfg.seed`` per step (``cfg.model_copy(update={"seed": ...})``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from agent_r1.config import ContextConfig, RolloutConfig
from agent_r1.env import Episode, RolloutEnv, StepResult
from agent_r1.rollout.engine import GenerationEngine, GenerationOutput, TurnByTurnSession, TurnSession, TurnSettings
from agent_r1.rollout.trajectory import TrajectoryBatch

# Stands in for the assistant's content when rendering a template delta; never tokenised.
PLACEHOLDER = "\x00AGENT_R1_ASSISTANT_CONTENT\x00"

INFO_FROM_METRICS: tuple[str, ...] = ("em", "f1", "answered")


def render(tokenizer: Any, messages: list[dict], tools: list[dict] | None) -> str:
    """The chat template's text for ``messages`` followed by the generation prompt."""
    return tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Tokenise template text: special tokens in it are already spelled out, so none are added."""
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def observation_delta(
    tokenizer: Any,
    history: list[dict],
    tools: list[dict] | None,
    observation: str,
    role: str,
    last_action_token: int,
) -> str:
    """The template text that follows the policy's tokens of this turn, up to the next generation prompt.

    ``history`` is the conversation before the assistant turn (ending where the
    policy started generating). When the policy ended its turn with the
    template's own closing token, that token is an action token and is not
    repeated here.
    """
    before = render(tokenizer, history, tools)
    after = render(
        tokenizer, [*history, {"role": "assistant", "content": PLACEHOLDER}, {"role": role, "content": observation}], tools
    )
    head = before + PLACEHOLDER
    if not after.startswith(head):
        raise ValueError(
            "the chat template does not render a conversation as a prefix of its continuation "
            f"(history of {len(history)} messages); cannot build observation tokens by delta"
        )
    delta = after[len(head) :]
    closing = tokenizer.convert_ids_to_tokens(last_action_token)
    if closing in tokenizer.all_special_tokens and delta.startswith(closing):
        delta = delta[len(closing) :]
    return delta


@dataclass
class EpisodeRecord:
    """One episode as the scheduler keeps it: the env's episode and its token-exact trajectory."""

    episode: Episode
    group_id: int
    input_ids: list[int]  # prompt, then every action and observation, concatenated
    prompt_length: int
    action_mask: list[int] = field(default_factory=list)
    turn_index: list[int] = field(default_factory=list)
    rollout_logprobs: list[float] = field(default_factory=list)
    turn_ends: list[int] = field(default_factory=list)  # position of each turn's last action token
    # managed context only (env.context): each turn's action ids, each observation in full and
    # shortened, and the ids shown at each turn (contexts[0] is the prompt)
    actions: list[list[int]] = field(default_factory=list)
    observations: list[tuple[list[int], list[int]]] = field(default_factory=list)
    contexts: list[list[int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = len(self.input_ids)
        self.action_mask, self.turn_index, self.rollout_logprobs = [0] * n, [-1] * n, [0.0] * n

    def add(self, ids: list[int], is_action: bool, logprobs: list[float] | None = None) -> None:
        """Append a turn's action ids (with their logprobs) or the observation ids that follow it."""
        turn = len(self.turn_ends) - (0 if is_action else 1)
        self.input_ids += ids
        self.action_mask += [int(is_action)] * len(ids)
        self.turn_index += [turn] * len(ids)
        self.rollout_logprobs += logprobs if is_action else [0.0] * len(ids)
        if is_action:
            self.turn_ends.append(len(self.input_ids) - 1)

    def token_rewards(self) -> list[float]:
        """Each turn's final process reward on its last action token, the outcome reward on the last one."""
        ep = self.episode
        finals = ep.final_turn_rewards
        if finals is None or ep.outcome_reward is None:
            raise RuntimeError(f"episode of record {ep.record.get('id')!r} ended without env.finish()")
        if len(finals) != len(self.turn_ends):
            raise RuntimeError(
                f"record {ep.record.get('id')!r}: env has {len(finals)} turn rewards for {len(self.turn_ends)} generated turns"
            )
        rewards = [0.0] * len(self.input_ids)
        for pos, r in zip(self.turn_ends, finals):
            rewards[pos] += float(r)
        rewards[self.turn_ends[-1]] += float(ep.outcome_reward)
        return rewards

    def info(self) -> dict:
        """The episode's metrics and bookkeeping (``TrajectoryBatch.info``)."""
        ep = self.episode
        metrics = dict(ep.metrics or {})
        info = {
            "question_id": ep.record.get("id"),
            "source": ep.record.get("source"),
            "type": ep.record.get("type"),
            "turns": ep.turn,
            "tool_calls": ep.tool_calls,
            "invalid_calls": ep.invalid_calls,
            "answer": ep.answer,
            "termination": ep.termination,
            "outcome_reward": float(ep.outcome_reward),
            "process_reward": float(sum(ep.final_turn_rewards)),
            "action_tokens": sum(self.action_mask),
            "total_tokens": len(self.input_ids),
        }
        for key in INFO_FROM_METRICS:
            info[key] = metrics.get(key)
        return {**metrics, **info}

    def as_sequence(self) -> dict:
        return {
            "input_ids": self.input_ids,
            "action_mask": self.action_mask,
            "turn_index": self.turn_index,
            "token_rewards": self.token_rewards(),
            "rollout_logprobs": self.rollout_logprobs,
            "group_id": self.group_id,
            "prompt_length": self.prompt_length,
            "contexts": self.contexts,
            "info": self.info(),
        }


def _start(env: RolloutEnv, tokenizer: Any, record: dict, group_id: int, tools: list[dict] | None,
           cfg: RolloutConfig) -> EpisodeRecord:
    """Reset the env for ``record``; the record of the new episode, its prompt rendered from the env's messages."""
    episode = env.reset(record)
    ids = encode(tokenizer, render(tokenizer, episode.messages, tools))
    if len(ids) >= cfg.max_total_tokens:
        raise ValueError(
            f"record {record.get('id')!r}: the prompt has {len(ids)} tokens, "
            f"rollout.max_total_tokens={cfg.max_total_tokens} leaves no room to generate"
        )
    t = EpisodeRecord(episode, group_id, list(ids), len(ids))
    if env.cfg.context.managed or env.rewrites_context:
        t.contexts.append(list(ids))
    return t


def shown_context(
    prompt: list[int], actions: list[list[int]], observations: list[tuple[list[int], list[int]]],
    context: ContextConfig,
) -> list[int]:
    """The ids the policy is shown before its next turn under ``context``.

    ``prompt | action 0 | observation 0 | action 1 | ...`` where observation k
    is ``observations[k]`` in full (its first ids) or shortened (its second):
    only the last ``keep_last`` are in full, and then the oldest full ones are
    shortened until the whole fits ``max_tokens`` (or none is left to shorten).
    """
    n = len(observations)
    short = [context.keep_last is not None and k < n - context.keep_last for k in range(n)]

    def build() -> list[int]:
        ids = list(prompt)
        for k, (full, brief) in enumerate(observations):
            ids += actions[k] + (brief if short[k] else full)
        return ids

    ids = build()
    for k in range(n):
        if context.max_tokens is None or len(ids) <= context.max_tokens:
            break
        if not short[k]:
            short[k] = True
            ids = build()
    return ids


def _history_before_turn(episode: Episode, text: str, res: StepResult) -> list[dict]:
    """The conversation before this turn's action: ``env.step_batch`` appended the action and,
    the episode going on, its observation to ``episode.messages``."""
    turn = [{"role": "assistant", "content": text}, {"role": res.observation_role, "content": res.observation}]
    if episode.messages[-2:] != turn:
        raise RuntimeError(
            f"record {episode.record.get('id')!r}: env.step_batch did not end Episode.messages with the turn's "
            "action and observation; cannot render the observation's template delta"
        )
    return episode.messages[:-2]


def _managed_context(t: EpisodeRecord, obs_ids: list[int], short_ids: list[int], env: RolloutEnv,
                     cfg: RolloutConfig) -> list[int] | None:
    """``env.context``: the full observation goes on the flat record; the policy is shown the managed context."""
    t.observations.append((obs_ids, short_ids))
    t.add(obs_ids, is_action=False)
    shown = shown_context(t.input_ids[: t.prompt_length], t.actions, t.observations, env.cfg.context)
    if len(shown) >= cfg.max_total_tokens:  # no token left to generate after it
        env.finish(t.episode, "max_length")
        return None
    t.contexts.append(shown)
    return shown


def _rewritten_context(t: EpisodeRecord, out: GenerationOutput, obs_ids: list[int], res: StepResult,
                       env: RolloutEnv, tokenizer: Any, tools: list[dict] | None, cfg: RolloutConfig) -> list[int] | None:
    """A stateful env that rewrites the conversation: the flat record keeps the full history; the
    policy is shown the env's context when it gives one, else what it was shown last, then its
    action and the observation."""
    t.add(obs_ids, is_action=False)
    if res.context is not None:
        shown = encode(tokenizer, render(tokenizer, res.context, tools))
    else:
        shown = t.contexts[-1] + list(out.token_ids) + obs_ids
    if len(shown) >= cfg.max_total_tokens:  # no token left to generate after it
        env.finish(t.episode, "max_length")
        return None
    t.contexts.append(shown)
    return shown


def _next_context(t: EpisodeRecord, out: GenerationOutput, text: str, res: StepResult, env: RolloutEnv,
                  tokenizer: Any, tools: list[dict] | None, cfg: RolloutConfig) -> list[int] | None:
    """Record a turn's action and its observation; return the context of the episode's next turn,
    or None when the episode is done."""
    t.add(out.token_ids, is_action=True, logprobs=out.logprobs)
    if res.done:
        return None
    history = _history_before_turn(t.episode, text, res)
    role = res.observation_role
    obs_ids = encode(tokenizer, observation_delta(tokenizer, history, tools, res.observation, role, out.token_ids[-1]))
    if env.rewrites_context:
        return _rewritten_context(t, out, obs_ids, res, env, tokenizer, tools, cfg)
    if env.cfg.context.managed:
        t.actions.append(list(out.token_ids))
        short = observation_delta(tokenizer, history, tools, res.short_observation, role, out.token_ids[-1])
        return _managed_context(t, obs_ids, encode(tokenizer, short), env, cfg)
    room = cfg.max_total_tokens - len(t.input_ids)
    if len(obs_ids) >= room:  # no token left to generate after it: truncate here
        t.add(obs_ids[:room], is_action=False)
        env.finish(t.episode, "max_length")
        return None
    t.add(obs_ids, is_action=False)
    return list(t.input_ids)


def _play_ended_turns(session: TurnSession, ended: list[tuple[int, GenerationOutput]], records: list[EpisodeRecord],
                      env: RolloutEnv, tokenizer: Any, tools: list[dict] | None, cfg: RolloutConfig) -> None:
    """Hand the turns that ended to the env together (their tool calls run as one batch); give the
    session each episode's next context, or drop the episode when it is done."""
    texts = [tokenizer.decode(out.token_ids, skip_special_tokens=True) for _, out in ended]
    results = env.step_batch([records[i].episode for i, _ in ended], texts)
    for (i, out), text, res in zip(ended, texts, results, strict=True):
        context = _next_context(records[i], out, text, res, env, tokenizer, tools, cfg)
        if context is None:
            session.drop(i)
        else:
            session.add(i, context)


def run_episodes(
    engine: GenerationEngine,
    env: RolloutEnv,
    tokenizer: Any,
    records: list[dict],
    cfg: RolloutConfig,
    greedy: bool = False,
) -> TrajectoryBatch:
    """Play ``cfg.n`` episodes of every record (1 when ``greedy``) to the end; see the module doc."""
    n = 1 if greedy else cfg.n
    tools = env.tool_specs()
    episodes = [_start(env, tokenizer, rec, g, tools, cfg) for g, rec in enumerate(records) for _ in range(n)]
    settings = TurnSettings(
        max_new_tokens=cfg.max_new_tokens, max_total_tokens=cfg.max_total_tokens,
        temperature=0.0 if greedy else cfg.temperature, top_p=cfg.top_p, slots=cfg.batch_size,
    )
    stop_strings = list(env.format.stop_strings)
    if cfg.continuous:
        session = engine.open_turns(settings, stop_strings, cfg.seed)
    else:
        session = TurnByTurnSession(engine, settings, stop_strings, cfg.seed)
    try:
        for i, t in enumerate(episodes):
            session.add(i, t.input_ids)
        while ended := session.step():
            _play_ended_turns(session, ended, episodes, env, tokenizer, tools, cfg)
    finally:  # a stopped rollout leaves no per-episode tool (an interpreter) running
        env.release([t.episode for t in episodes if not t.episode.done])

    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TrajectoryBatch.from_sequences([t.as_sequence() for t in episodes], pad_id)
