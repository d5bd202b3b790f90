"""run_episodes: token-exact trajectories, masks, reward placement, truncation, with the real ToolEnv.

Most tests drive the loop with ``ScriptedEngine`` (a test double returning
predetermined token ids) so every expected token and reward is known; the last
ones run the real TransformersEngine with a real BM25 index.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from agent_r1.config import EnvConfig, ProcessRewardConfig, RetrievalConfig, RewardConfig, RolloutConfig
from agent_r1.data.schema import corpus_frame
from agent_r1.env import SearchTool, ToolEnv
from agent_r1.retrieval import build_index
from agent_r1.retrieval.base import Hit
from agent_r1.rollout import GenerationEngine, GenerationOutput, TrajectoryBatch, TransformersEngine, run_episodes

ROOT = Path(__file__).resolve().parents[1]

RECORDS = [
    {
        "id": "q0",
        "question": "In which city was the founder of Velmora Labs born?",
        "answers": ["Quorvale"],
        "supporting_titles": ["Velmora Labs", "Ilsa Brandt"],
        "type": "bridge",
        "source": "test",
        "split": "train",
    },
    {
        "id": "q1",
        "question": "Which river flows past Dorvel Cathedral?",
        "answers": ["Ormund River", "the Ormund"],
        "supporting_titles": ["Dorvel Cathedral"],
        "type": "bridge",
        "source": "test",
        "split": "train",
    },
]
DOCS = [
    ("Velmora Labs", "Velmora Labs is a robotics company founded by Ilsa Brandt in 1998."),
    ("Ilsa Brandt", "Ilsa Brandt is an engineer born in Quorvale, a harbour town."),
    ("Dorvel Cathedral", "Dorvel Cathedral is a gothic church on the banks of the Ormund River."),
    ("Ormund River", "The Ormund River flows north through pine forests before reaching the sea."),
    ("Pellim Station", "Pellim Station is a railway station serving commuter trains to the capital."),
    ("Kessa Lin", "Kessa Lin is a painter whose landscapes hang in the national gallery."),
]


class FakeIndex:
    """Every query returns the 'Ilsa Brandt' document: a supporting doc for q0."""

    def search(self, queries: list[str], top_k: int) -> list[list[Hit]]:
        return [[Hit("d1", "Ilsa Brandt", "Ilsa Brandt is an engineer born in Quorvale.", 1.0)] for _ in queries]


class RecordingEnv(ToolEnv):
    """The real ToolEnv, keeping every episode it creates so tests can inspect them."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.episodes = []
        self.reset_lengths: list[int] = []  # messages at reset (system, one-shot example, question)

    def reset(self, record):
        ep = super().reset(record)
        self.episodes.append(ep)
        self.reset_lengths.append(len(ep.messages))
        return ep


class ScriptedEngine(GenerationEngine):
    """Replies with predetermined text per turn, as token ids; records every call.

    ``replies[k]`` is the reply of an episode's turn k (k = how many earlier
    prompts are a prefix of this one, i.e. the episode's earlier turns). Honours ``max_new_tokens`` ("length")
    and gives the i-th token of a reply the logprob ``-(i + 1) / 100``.
    """

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer = tokenizer
        self.replies = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
        self.calls: list[tuple[list[int], int, GenerationOutput]] = []
        self.temperatures: list[float] = []

    def generate(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_strings=(), seed=None):
        self.temperatures.append(temperature)
        limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        outs = []
        for prompt, limit in zip(prompts, limits):
            turn = len({len(p) for p, _, _ in self.calls if p == prompt[: len(p)] and len(p) < len(prompt)})
            ids = self.replies[min(turn, len(self.replies) - 1)]
            out = GenerationOutput(
                ids[:limit], [-(i + 1) / 100 for i in range(min(limit, len(ids)))], "stop" if len(ids) <= limit else "length"
            )
            self.calls.append((list(prompt), limit, out))
            outs.append(out)
        return outs


class RecordingEngine(GenerationEngine):
    """Delegates to a real engine and records every (prompt, limit, output)."""

    def __init__(self, inner: GenerationEngine):
        self.inner = inner
        self.calls: list[tuple[list[int], int, GenerationOutput]] = []

    def generate(self, prompts, max_new_tokens, **kwargs):
        outs = self.inner.generate(prompts, max_new_tokens, **kwargs)
        limits = max_new_tokens if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
        self.calls += [(list(p), n, o) for p, n, o in zip(prompts, limits, outs)]
        return outs


@pytest.fixture(scope="module")
def model_dir(request: pytest.FixtureRequest) -> Path:
    local = ROOT / "models" / "policy"
    return local if (local / "config.json").exists() else request.getfixturevalue("policy_dir")


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(model_dir)


# Process rewards that pay for calls too (params.yaml's valid_call is 0): the expected rewards below hold each term.
PAID_CALLS = RewardConfig(process=ProcessRewardConfig(valid_call=0.02, new_support_doc=0.1, invalid_call=-0.05, cap=0.3))


def make_env(fmt: str = "tags", index=None, **env_kwargs) -> RecordingEnv:
    cfg = EnvConfig(**{"format": fmt, "reward": PAID_CALLS, **env_kwargs})
    return RecordingEnv([SearchTool(index or FakeIndex(), top_k=1)], cfg)


def rollout_cfg(**kwargs) -> RolloutConfig:
    return RolloutConfig(**{"n": 2, "max_new_tokens": 48, "max_total_tokens": 2048, "batch_size": 3, **kwargs})


def check_token_exact(batch: TrajectoryBatch, calls: list[tuple[list[int], int, GenerationOutput]]) -> None:
    """Rebuild each trajectory's action mask, logprobs and turn chain from the engine's recorded calls.

    A call belongs to a trajectory when its prompt is a prefix of the
    trajectory; its output must follow the prompt verbatim. The action mask
    must be 1 exactly on those outputs, every turn's prompt must be the
    trajectory up to that turn, and every call must belong to some trajectory.
    """
    used = set()
    for b in range(len(batch)):
        n = int(batch.attention_mask[b].sum())
        ids = batch.input_ids[b, :n].tolist()
        expected_mask = [0] * n
        expected_lp = [0.0] * n
        spans: dict[int, GenerationOutput] = {}  # turn start -> output (identical samples share calls)
        for c, (prompt, _, out) in enumerate(calls):
            if ids[: len(prompt)] == prompt and ids[len(prompt) : len(prompt) + len(out.token_ids)] == out.token_ids:
                used.add(c)
                spans[len(prompt)] = out
        for start, out in spans.items():
            for j, lp in enumerate(out.logprobs):
                expected_mask[start + j] = 1
                expected_lp[start + j] = lp
        assert min(spans) == batch.prompt_length[b]
        assert batch.action_mask[b, :n].tolist() == expected_mask, f"trajectory {b}"
        assert torch.allclose(batch.rollout_logprobs[b, :n], torch.tensor(expected_lp)), f"trajectory {b}"
        assert len(spans) == batch.info[b]["turns"] == int(batch.turn_index[b].max()) + 1
        assert batch.action_mask[b, n:].sum() == 0 and batch.attention_mask[b, n:].sum() == 0
    assert used == set(range(len(calls))), "engine outputs missing from the batch"


# ------------------------------------------------------------------ scripted
TAGS_REPLIES = ["I should look up the founder.<search>Ilsa Brandt</search><|im_end|>", "<answer>Quorvale</answer>"]
TOOL_CALL_REPLIES = ['<tool_call>{"name": "search", "arguments": {"query": "Ilsa Brandt"}}</tool_call>', "<answer>Quorvale</answer>"]


@pytest.mark.parametrize("fmt, replies", [("tags", TAGS_REPLIES), ("tool_call", TOOL_CALL_REPLIES)])
def test_scripted_trajectories_are_token_exact(tokenizer, fmt: str, replies: list[str]) -> None:
    env, engine = make_env(fmt), ScriptedEngine(tokenizer, replies)
    batch = run_episodes(engine, env, tokenizer, RECORDS, rollout_cfg())
    assert len(batch) == 4 and batch.group_id.tolist() == [0, 0, 1, 1]
    check_token_exact(batch, engine.calls)
    for b, ep in enumerate(env.episodes):
        n = int(batch.attention_mask[b].sum())
        ids = batch.input_ids[b, :n].tolist()
        # the prompt is exactly the chat template of the first two messages
        first = tokenizer.apply_chat_template(ep.messages[: env.reset_lengths[b]], tools=env.tool_specs(), add_generation_prompt=True, tokenize=False)
        assert ids[: batch.prompt_length[b]] == tokenizer(first, add_special_tokens=False)["input_ids"]
        # and the whole trajectory spells the template of the whole conversation (last turn left open)
        whole = tokenizer.apply_chat_template(ep.messages, tools=env.tool_specs(), tokenize=False)
        assert tokenizer.decode(ids) == whole.removesuffix("\n").removesuffix("<|im_end|>")
        assert ep.termination == "answer" and batch.info[b]["termination"] == "answer"
    # turn 0 of the tags script ends with the model's own <|im_end|>: the template's closing is not doubled
    if fmt == "tags":
        text = tokenizer.decode(batch.input_ids[0, : int(batch.attention_mask[0].sum())])
        assert "</search><|im_end|>\n<|im_start|>user\n<information>" in text


def test_rewards_and_turn_index_land_on_the_right_tokens(tokenizer) -> None:
    env, engine = make_env("tags"), ScriptedEngine(tokenizer, TAGS_REPLIES)
    batch = run_episodes(engine, env, tokenizer, RECORDS[:1], rollout_cfg(n=1))
    ids = batch.input_ids[0].tolist()
    n_prompt, a0, a1 = int(batch.prompt_length[0]), len(engine.calls[0][2].token_ids), len(engine.calls[1][2].token_ids)
    end0 = n_prompt + a0 - 1
    start1 = len(engine.calls[1][0])
    end1 = start1 + a1 - 1
    assert end1 == len(ids) - 1
    expected = torch.zeros(len(ids))
    expected[end0] = 0.02 + 0.1  # a valid call + a new supporting doc (defaults of ProcessRewardConfig)
    expected[end1] = 1.0  # correct answer, valid format
    assert torch.allclose(batch.token_rewards[0], expected)
    turn = [-1] * n_prompt + [0] * (start1 - n_prompt) + [1] * a1
    assert batch.turn_index[0].tolist() == turn
    info = batch.info[0]
    assert info["outcome_reward"] == 1.0 and info["process_reward"] == pytest.approx(0.12)
    assert (info["em"], info["f1"], info["answered"], info["turns"], info["tool_calls"]) == (1.0, 1.0, True, 2, 1)
    assert info["question_id"] == "q0" and info["answer"] == "Quorvale"


def test_max_turns_ends_after_the_last_action(tokenizer) -> None:
    env, engine = make_env("tags", max_turns=3), ScriptedEngine(tokenizer, ["<search>Ilsa Brandt</search>"])
    batch = run_episodes(engine, env, tokenizer, RECORDS[:1], rollout_cfg(n=1))
    check_token_exact(batch, engine.calls)
    assert len(engine.calls) == 3 and batch.info[0]["termination"] == "max_turns"
    n = int(batch.attention_mask[0].sum())
    assert batch.action_mask[0, n - 1] == 1  # nothing after the last turn
    # never answered: positive process rewards are dropped, the outcome is format_score - 1 on the last token
    nonzero = batch.token_rewards[0].nonzero().flatten().tolist()
    assert nonzero == [n - 1] and batch.token_rewards[0, n - 1].item() == pytest.approx(-0.9)


def test_max_length_truncates_the_observation(tokenizer) -> None:
    env, engine = make_env("tags"), ScriptedEngine(tokenizer, ["<search>Ilsa Brandt</search>"])
    prompt_len = run_episodes(ScriptedEngine(tokenizer, ["<answer>x</answer>"]), make_env(), tokenizer, RECORDS[:1], rollout_cfg(n=1)).prompt_length[0].item()
    cfg = rollout_cfg(n=1, max_new_tokens=20, max_total_tokens=prompt_len + 25)  # one turn fits, its observation does not
    batch = run_episodes(engine, env, tokenizer, RECORDS[:1], cfg)
    assert int(batch.attention_mask[0].sum()) == cfg.max_total_tokens
    assert len(engine.calls) == 1 and batch.info[0]["termination"] == "max_length"
    assert batch.action_mask[0, -1] == 0 and batch.turn_index[0, -1] == 0  # truncated observation of turn 0
    check_token_exact(batch, engine.calls)
    last_action = int(batch.action_mask[0].nonzero().max())
    assert batch.token_rewards[0].nonzero().flatten().tolist() == [last_action]


def test_generation_budget_is_clipped_by_max_total_tokens(tokenizer) -> None:
    long_reply = "<search>" + " ".join(["Ilsa Brandt"] * 30) + "</search>"
    env, engine = make_env("tags"), ScriptedEngine(tokenizer, [long_reply])
    prompt_len = len(tokenizer(tokenizer.apply_chat_template(make_env().reset(RECORDS[0]).messages, add_generation_prompt=True, tokenize=False), add_special_tokens=False)["input_ids"])
    cfg = rollout_cfg(n=1, max_new_tokens=60, max_total_tokens=prompt_len + 10)
    batch = run_episodes(engine, env, tokenizer, RECORDS[:1], cfg)
    assert engine.calls[0][1] == 10 and engine.calls[0][2].finish_reason == "length"
    assert int(batch.attention_mask[0].sum()) == cfg.max_total_tokens and int(batch.action_mask[0].sum()) == 10
    assert batch.info[0]["termination"] == "max_length"


def test_greedy_uses_one_sample_at_temperature_zero(tokenizer) -> None:
    engine = ScriptedEngine(tokenizer, TAGS_REPLIES)
    batch = run_episodes(engine, make_env(), tokenizer, RECORDS, rollout_cfg(n=4), greedy=True)
    assert batch.group_id.tolist() == [0, 1] and set(engine.temperatures) == {0.0}


def test_prompt_longer_than_the_budget_names_the_record(tokenizer) -> None:
    with pytest.raises(ValueError, match="record 'q0'.*max_total_tokens=64"):
        run_episodes(ScriptedEngine(tokenizer, ["x"]), make_env(), tokenizer, RECORDS, rollout_cfg(max_new_tokens=8, max_total_tokens=64))


# ---------------------------------------------------------------- real model
@pytest.fixture(scope="module")
def bm25(tmp_path_factory: pytest.TempPathFactory):
    corpus = corpus_frame([{"doc_id": f"d{i}", "title": t, "text": x} for i, (t, x) in enumerate(DOCS)])
    return build_index("bm25", corpus, tmp_path_factory.mktemp("idx") / "bm25", RetrievalConfig())


@pytest.fixture(scope="module")
def fp32_engine(model_dir: Path) -> TransformersEngine:
    return TransformersEngine(model_dir, dtype="float32")


def teacher_forced_diff(model, batch: TrajectoryBatch, temperature: float) -> torch.Tensor:
    """|rollout logprob - teacher-forced logprob at the sampling temperature| of every action token, float32."""
    act = batch.action_mask[:, 1:] == 1  # position t predicts token t + 1
    with torch.inference_mode():
        hidden = model.get_decoder()(input_ids=batch.input_ids, attention_mask=batch.attention_mask).last_hidden_state
        logits = hidden[:, :-1][act].float() @ model.get_output_embeddings().weight.float().T
    tf = torch.log_softmax(logits / temperature, -1).gather(-1, batch.input_ids[:, 1:][act][:, None]).squeeze(-1)
    return (tf - batch.rollout_logprobs[:, 1:][act]).abs()


@pytest.mark.parametrize("fmt", ["tool_call"])  # tags: the continuous test below
def test_real_engine_and_env_rollout_is_token_exact(fmt: str, fp32_engine: TransformersEngine, bm25, tokenizer) -> None:
    """Real model + real BM25 ToolEnv; the rollout logprobs must survive a teacher-forced pass of the whole batch.

    float32, so agreement is to rounding (measured ~1e-6): any misplaced
    observation token, wrong position or mask in the multi-turn concatenation
    would show up as differences of order 1.
    """
    engine = RecordingEngine(fp32_engine)
    env = make_env(fmt, index=bm25, max_turns=2, one_shot=True)
    cfg = rollout_cfg(n=2, max_new_tokens=24, max_total_tokens=1024, batch_size=4, seed=1, continuous=False)
    batch = run_episodes(engine, env, tokenizer, RECORDS, cfg)
    check_token_exact(batch, engine.calls)
    diff = teacher_forced_diff(fp32_engine.model, batch, cfg.temperature)
    turns = [i["turns"] for i in batch.info]
    print(f"\n{fmt}: turns {turns}, terminations {[i['termination'] for i in batch.info]}, "
          f"teacher-forced |diff| mean {diff.mean():.2e} max {diff.max():.2e} over {len(diff)} action tokens")
    assert diff.mean() < 1e-4 and diff.max() < 1e-3
    for info in batch.info:
        assert info["termination"] in ("answer", "max_turns", "no_action", "max_length")
        assert {"question_id", "em", "f1", "answered", "tool_calls", "invalid_calls", "outcome_reward"} <= set(info)


def reprefill_work(batch: TrajectoryBatch) -> int:
    """Tokens a per-turn engine runs for these episodes: each turn prefills the whole history
    before it, then feeds back every sampled token but the turn's last."""
    work = 0
    for row in range(len(batch)):
        action = (batch.action_mask[row] == 1).nonzero().squeeze(-1)
        turns = batch.turn_index[row][action]
        for k in turns.unique().tolist():
            positions = action[turns == k]
            work += int(positions[0]) + len(positions) - 1
    return work


def test_continuous_rollout_computes_each_token_once_and_matches_teacher_forcing(fp32_engine, bm25, tokenizer) -> None:
    """Cross-turn KV reuse and slot refilling (3 slots for 4 episodes) are exact and prefill nothing twice.

    ``row_tokens`` counts, per episode, the tokens whose KV the engine computed
    for it. The per-turn path re-prefills the history every turn (the control:
    its count equals :func:`reprefill_work` of its own episodes); the
    continuous one computes every token of an episode once (the last sampled
    token is never fed), and a group's shared prompt once per group.
    """
    env = make_env("tags", index=bm25, max_turns=3, one_shot=True)
    for continuous in (False, True):
        fp32_engine.stats = dict.fromkeys(fp32_engine.stats, 0)
        cfg = rollout_cfg(n=2, max_new_tokens=24, max_total_tokens=1024, batch_size=3, seed=3, continuous=continuous)
        batch = run_episodes(fp32_engine, env, tokenizer, RECORDS, cfg)
        stats, final = fp32_engine.stats, int(batch.attention_mask.sum())
        turns = [i["turns"] for i in batch.info]
        diff = teacher_forced_diff(fp32_engine.model, batch, cfg.temperature)
        print(f"\ncontinuous={continuous}: turns {turns}, final tokens {final}, stats {stats}, "
              f"re-prefill work {reprefill_work(batch)}, |diff| mean {diff.mean():.2e} max {diff.max():.2e}")
        assert diff.mean() < 1e-4 and diff.max() < 1e-3
        assert sum(turns) > len(turns)  # multi-turn, or there is nothing to reuse
        if continuous:
            assert stats["row_tokens"] == final - len(batch)
            assert stats["prefill_tokens"] + stats["decode_tokens"] < stats["row_tokens"]  # the shared prompt
        else:
            assert stats["row_tokens"] == reprefill_work(batch) > 1.2 * final


# ------------------------------------------------------------ context management (env.context)
def test_shown_context_shortens_older_observations_then_the_oldest_to_fit_the_budget() -> None:
    from agent_r1.config import ContextConfig
    from agent_r1.rollout.scheduler import shown_context

    prompt, actions = [1, 2], [[10], [11], [12]]
    obs = [([20, 21, 23], [22]), ([30, 31, 33], [32]), ([40, 41, 43], [42])]
    full = [1, 2, 10, 20, 21, 23, 11, 30, 31, 33, 12, 40, 41, 43]
    assert shown_context(prompt, actions, obs, ContextConfig()) == full
    assert shown_context(prompt, actions, obs, ContextConfig(keep_last=1)) == [1, 2, 10, 22, 11, 32, 12, 40, 41, 43]
    assert shown_context(prompt, actions, obs, ContextConfig(keep_last=0)) == [1, 2, 10, 22, 11, 32, 12, 42]
    assert shown_context(prompt, actions, obs, ContextConfig(keep_last=5)) == full
    # a budget shortens the oldest full observations first, only as many as it takes
    assert shown_context(prompt, actions, obs, ContextConfig(max_tokens=12)) == [1, 2, 10, 22, 11, 30, 31, 33, 12, 40, 41, 43]
    assert shown_context(prompt, actions, obs, ContextConfig(max_tokens=10)) == [1, 2, 10, 22, 11, 32, 12, 40, 41, 43]
    assert shown_context(prompt, actions, obs, ContextConfig(max_tokens=3)) == [1, 2, 10, 22, 11, 32, 12, 42]  # all it can
    assert shown_context(prompt, actions[:1], obs[:0], ContextConfig(keep_last=0)) == [1, 2]  # no observation yet


class ObservationCountingEngine(GenerationEngine):
    """Replies ``replies[k]`` where k = the observations in the prompt (``</information>`` tags): the
    turn index even when earlier observations are shown shortened. Records every prompt."""

    def __init__(self, tokenizer, replies: list[str]):
        self.tokenizer, self.prompts = tokenizer, []
        self.replies = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]

    def generate(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_strings=(), seed=None):
        outs = []
        for prompt in prompts:
            self.prompts.append(list(prompt))
            ids = self.replies[self.tokenizer.decode(prompt).count("</information>") - 1]  # 1: the system prompt's
            outs.append(GenerationOutput(list(ids), [-0.5] * len(ids), "stop"))
        return outs


def test_managed_context_shows_older_observations_by_title_and_records_each_turns_context(tokenizer) -> None:
    """keep_last=1: at turn 2 the first search's documents are shown by title only, the second's in full;
    the flat record keeps the full history, and the steps train on the contexts as shown."""
    from agent_r1.rollout.steps import steps_from_trajectories

    replies = ["<search>founder of Velmora Labs</search>", "<search>Ilsa Brandt birthplace</search>",
               "<answer>Quorvale</answer>"]
    engine = ObservationCountingEngine(tokenizer, replies)
    env = make_env("tags", max_turns=3, one_shot=False, context={"keep_last": 1})
    batch = run_episodes(engine, env, tokenizer, RECORDS[:1], rollout_cfg(n=1, continuous=False))
    assert batch.info[0]["turns"] == 3 and batch.info[0]["em"] == 1.0
    full_doc = "Doc 1 (Ilsa Brandt): Ilsa Brandt is an engineer born in Quorvale."
    flat = tokenizer.decode(batch.input_ids[0, : int(batch.attention_mask[0].sum())])
    assert flat.count(full_doc) == 2  # the flat record: every observation in full

    contexts = batch.contexts[0]
    assert [c for c in engine.prompts] == contexts  # the engine saw exactly the recorded contexts
    shown = [tokenizer.decode(c) for c in contexts]
    assert shown[0] == tokenizer.decode(batch.input_ids[0, : int(batch.prompt_length[0])])
    assert shown[1].count(full_doc) == 1  # turn 1: the one observation, in full (keep_last=1)
    assert shown[2].count(full_doc) == 1 and shown[2].count("<information>Doc 1 (Ilsa Brandt)</information>") == 1
    assert shown[2].endswith("<|im_start|>assistant\n") and len(contexts[2]) < int(batch.attention_mask[0].sum())

    from agent_r1.rollout.inspect import render  # what `agent-r1 chat` prints

    printed = render(batch, 0, tokenizer)
    assert printed.count("--- context shown at turn") == 2
    assert printed.split("--- context shown at turn 2")[1].count("<information>Doc 1 (Ilsa Brandt)</information>") == 1

    steps = steps_from_trajectories(batch)
    for k in range(3):
        n = int(steps.attention_mask[k].sum())
        assert steps.input_ids[k, : int(steps.prompt_length[k])].tolist() == contexts[k]
        assert tokenizer.decode(steps.input_ids[k, int(steps.prompt_length[k]) : n]) == replies[k]


def test_managed_context_trains_only_as_steps_and_its_budget_leaves_room() -> None:
    from agent_r1.config import ParamsError, parse_params

    base = {"experiments": {"grpo": {"overrides": {"env": {"context": {"keep_last": 1}, "one_shot": False}}}}}
    with pytest.raises(ParamsError, match=r"env.context.*representation: step"):
        parse_params(base)
    ok = {"experiments": {"grpo": {"overrides": {"env": {"context": {"keep_last": 1}, "one_shot": False},
                                                "algorithm": {"representation": "step"}}}}}
    assert parse_params(ok).experiments["grpo"].overrides["env"]["context"]["keep_last"] == 1
    with pytest.raises(ParamsError, match=r"env.context.max_tokens \(1000\) \+ rollout.max_new_tokens"):
        parse_params({"env": {"context": {"max_tokens": 1000}}, "experiments": {}})


@pytest.mark.parametrize("continuous", [pytest.param(False, marks=pytest.mark.slow), True])
def test_real_engine_sees_the_managed_context_and_steps_score_the_same(continuous: bool, fp32_engine, bm25, tokenizer) -> None:
    """keep_last=0: from turn 1 on, every observation is shown by title only. The engine's logprobs
    must match a teacher-forced pass over each step's recorded context (had it kept the full history,
    or a stale cache past the changed observation, they would differ by order 1), and the continuous
    engine prefills only what changed: less than re-prefilling every context."""
    from agent_r1.rollout.steps import steps_from_trajectories

    env = make_env("tags", index=bm25, max_turns=3, one_shot=True, context={"keep_last": 0})
    fp32_engine.stats = dict.fromkeys(fp32_engine.stats, 0)
    cfg = rollout_cfg(n=2, max_new_tokens=24, max_total_tokens=1024, batch_size=3, seed=3, continuous=continuous)
    batch = run_episodes(fp32_engine, env, tokenizer, RECORDS, cfg)
    steps = steps_from_trajectories(batch)
    diff = teacher_forced_diff(fp32_engine.model, steps, cfg.temperature)
    managed = [k for r, c in enumerate(batch.contexts) for k in range(1, len(c))
               if c[k] != batch.input_ids[r, : len(c[k])].tolist()]
    print(f"\ncontinuous={continuous}: turns {[i['turns'] for i in batch.info]}, stats {fp32_engine.stats}, "
          f"|diff| max {diff.max():.2e}")
    assert managed, "no turn was shown a managed context: nothing was tested"
    assert diff.mean() < 1e-4 and diff.max() < 1e-3
    if continuous:
        assert fp32_engine.stats["row_tokens"] < int(steps.attention_mask.sum())


def test_the_default_session_is_one_generate_call_per_turn_shortest_first(tokenizer) -> None:
    """An engine without a session of its own plays each turn as ``generate`` calls of at most
    ``slots`` contexts, sorted by length (ties in the order first added), the i-th call seeded by
    the i-th draw of ``random.Random(seed)``; and it shares no weights."""
    import random

    from agent_r1.rollout.engine import TurnByTurnSession, TurnSettings

    seeds: list[int] = []

    class SeedRecordingEngine(ScriptedEngine):
        def generate(self, prompts, max_new_tokens, temperature=1.0, top_p=1.0, stop_strings=(), seed=None):
            seeds.append(seed)
            return super().generate(prompts, max_new_tokens, temperature, top_p, stop_strings, seed)

    engine = SeedRecordingEngine(tokenizer, ["<answer>x</answer>"])
    session = engine.open_turns(TurnSettings(max_new_tokens=4, max_total_tokens=7, temperature=1.0, top_p=1.0, slots=2), seed=5)
    assert isinstance(session, TurnByTurnSession) and engine.share_weights({}) is False
    for key, context in (("a", [1, 2, 3, 4, 5]), ("b", [1, 2, 3]), ("c", [9, 8, 7, 6, 5])):
        session.add(key, context)
    ended = session.step()
    assert [key for key, _ in ended] == ["b", "a", "c"]
    assert [(prompt, limit) for prompt, limit, _ in engine.calls] == [([1, 2, 3], 4), ([1, 2, 3, 4, 5], 2), ([9, 8, 7, 6, 5], 2)]
    draws = random.Random(5)
    assert seeds == [draws.getrandbits(63), draws.getrandbits(63)]
    assert session.step() == []
