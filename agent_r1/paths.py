"""Where each stage reads and writes, relative to the project root.

``dvc.yaml`` declares the same paths as deps/outs; keep the two in step.
"""

from pathlib import Path

DATA_DIR = Path("data")
RAW_DIR = DATA_DIR / "raw"  # download stage: official files as published
RAW_SOURCE = RAW_DIR / "source.json"  # which source, and which file in RAW_DIR holds it
PREPARED_DIR = DATA_DIR / "prepared"  # prepare stage: normalised parquet
TRAIN_QUESTIONS = PREPARED_DIR / "train.parquet"
TEST_QUESTIONS = PREPARED_DIR / "test.parquet"
CORPUS = PREPARED_DIR / "corpus.parquet"

MODELS_DIR = Path("models")
POLICY_DIR = MODELS_DIR / "policy"  # transformers folder of the base policy
ENCODER_DIR = MODELS_DIR / "encoder"  # sentence-transformers folder for dense retrieval

INDEX_DIR = Path("indexes")
REMOTE_INDEX_SCHEMES = ("http://", "https://")  # retrieval.index: a retrieval server, not a folder
METRICS_DIR = Path("metrics")
RETRIEVAL_METRICS = METRICS_DIR / "retrieval.json"
PREPARE_METRICS = METRICS_DIR / "data.json"
EVAL_METRICS_DIR = METRICS_DIR / "eval"  # one <method>.json per evaluated method
BASELINE_METRICS_DIR = METRICS_DIR / "eval"  # baselines and the warm start: shared by every experiment root
REPORTS_DIR = Path("reports")
RESULTS_MD = REPORTS_DIR / "results.md"
RESULTS_PNG = REPORTS_DIR / "results.png"
SFT_MODEL = MODELS_DIR / "sft"  # the warm-started policy
SFT_METRICS = METRICS_DIR / "sft.json"
TRAINING_PNG = REPORTS_DIR / "training.png"

# Per-experiment outputs (train@NAME, evaluate@NAME, report), relative to the experiment
# root: "." for params.yaml's `experiments`, a presets file's folder (paper/) for presets.
TRAINED_DIR = MODELS_DIR / "trained"  # trained/<experiment>: the final policy of each experiment
CHECKPOINT_DIR = Path("checkpoints")  # checkpoints/<experiment>: DeepSpeed checkpoints (persisted)
LIVE_DIR = Path("dvclive")  # dvclive/<experiment>: per-step training metrics and plots
TRAIN_METRICS_DIR = METRICS_DIR / "train"
EXPERIMENT_ROOT = Path(".")


def index_location(index: str) -> Path | str:
    """Where ``retrieval.index`` lives: a retrieval server's URL as is, else the index stage's folder of that kind."""
    return index if index.startswith(REMOTE_INDEX_SCHEMES) else INDEX_DIR / index


def set_experiment_root(root: Path) -> None:
    """Move the per-experiment outputs under ``root`` (the stages call this for ``--presets``).

    The paper's presets write to paper/models/trained/..., paper/metrics/eval/... so they
    never feed the default report (whose deps are metrics/eval and dvclive): `dvc repro`
    of the default pipeline must not train them.
    """
    global EXPERIMENT_ROOT, TRAINED_DIR, CHECKPOINT_DIR, LIVE_DIR, TRAIN_METRICS_DIR, EVAL_METRICS_DIR
    global RESULTS_MD, RESULTS_PNG, TRAINING_PNG
    EXPERIMENT_ROOT = Path(root)
    TRAINED_DIR = EXPERIMENT_ROOT / MODELS_DIR / "trained"
    CHECKPOINT_DIR = EXPERIMENT_ROOT / "checkpoints"
    LIVE_DIR = EXPERIMENT_ROOT / "dvclive"
    TRAIN_METRICS_DIR = EXPERIMENT_ROOT / METRICS_DIR / "train"
    EVAL_METRICS_DIR = EXPERIMENT_ROOT / METRICS_DIR / "eval"
    RESULTS_MD = EXPERIMENT_ROOT / REPORTS_DIR / "results.md"
    RESULTS_PNG = EXPERIMENT_ROOT / REPORTS_DIR / "results.png"
    TRAINING_PNG = EXPERIMENT_ROOT / REPORTS_DIR / "training.png"
