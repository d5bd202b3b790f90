"""Default locations of the stages' inputs and outputs, relative to the project root.

Each stage takes its paths as arguments (``dvc.yaml`` passes them in its ``cmd``,
next to the same paths as deps/outs); these are the defaults of those arguments,
so a bare ``python -m agent_r1.stages.X`` reads and writes where ``dvc.yaml`` does.
Constants only: nothing here is changed at run time.
"""

from pathlib import Path

DATA_DIR = Path("data")
RAW_DIR = DATA_DIR / "raw"  # download stage: official files as published
RAW_SOURCE = RAW_DIR / "source.json"  # which source, and which file in RAW_DIR holds it
PREPARED_DIR = DATA_DIR / "prepared"  # prepare stage: normalised parquet
TRAIN_QUESTIONS = PREPARED_DIR / "train.parquet"
VAL_QUESTIONS = PREPARED_DIR / "val.parquet"  # held out of train: what in-training evals read
TEST_QUESTIONS = PREPARED_DIR / "test.parquet"
CORPUS = PREPARED_DIR / "corpus.parquet"

MODELS_DIR = Path("models")
POLICY_DIR = MODELS_DIR / "policy"  # transformers folder of the base policy
ENCODER_DIR = MODELS_DIR / "encoder"  # sentence-transformers folder for dense retrieval

INDEX_DIR = Path("indexes")
REMOTE_INDEX_SCHEMES = ("http://", "https://")  # retrieval.url, or --index: a retrieval server, not a folder
METRICS_DIR = Path("metrics")
RETRIEVAL_METRICS = METRICS_DIR / "retrieval.json"
PREPARE_METRICS = METRICS_DIR / "data.json"
EVAL_METRICS_DIR = METRICS_DIR / "eval"  # one <method>.json per evaluated method
OUTCOMES_DIR = Path("outcomes")  # one <method>.jsonl per evaluated method: its per-question results
REPORTS_DIR = Path("reports")
RESULTS_MD = REPORTS_DIR / "results.md"
RESULTS_PNG = REPORTS_DIR / "results.png"
SFT_MODEL = MODELS_DIR / "sft"  # the warm-started policy
SFT_METRICS = METRICS_DIR / "sft.json"
TRAINING_PNG = REPORTS_DIR / "training.png"
ABLATIONS_PNG = REPORTS_DIR / "ablations.png"  # written for a report with ablations (the paper presets)

# Per-experiment outputs (train@NAME, evaluate@NAME): <folder>/<experiment>.
TRAINED_DIR = MODELS_DIR / "trained"  # trained/<experiment>: the final policy of each experiment
CHECKPOINT_DIR = Path("checkpoints")  # checkpoints/<experiment>: DeepSpeed checkpoints (persisted)
LIVE_DIR = Path("dvclive")  # dvclive/<experiment>: per-step training metrics and plots
TRAIN_METRICS_DIR = METRICS_DIR / "train"


def index_location(index: str, indexes: Path = INDEX_DIR, url: str | None = None) -> Path | str:
    """Where the agent searches: the retrieval server at ``url`` (``retrieval.url``) when set,
    else the folder of kind ``index`` (``retrieval.index``) in ``indexes``."""
    return url if url is not None else Path(indexes) / index



# A presets file runs each preset once per training seed: its files are named <preset>.seed<k>.
SEED_TAG = ".seed"


def seeded(name: str, seed: int) -> str:
    """The file stem of run ``seed`` of preset ``name``: ``grpo.seed1``."""
    return f"{name}{SEED_TAG}{seed}"


def split_seeded(stem: str) -> tuple[str, int | None]:
    """``grpo.seed1`` -> ``("grpo", 1)``; a stem without a seed tag -> ``(stem, None)``."""
    name, tag, seed = stem.rpartition(SEED_TAG)
    return (name, int(seed)) if tag and name and seed.isdigit() else (stem, None)
