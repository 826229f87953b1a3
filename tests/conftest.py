import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest  # noqa: E402
from helpers.tiny_models import tiny_model  # noqa: E402
from helpers.tiny_tokenizer import build_tiny_tokenizer  # noqa: E402

from skiptrain.core.schedules import Hierarchical, Ranked, SkipDecode  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session", autouse=True)
def torch_extensions_dir(tmp_path_factory) -> Iterator[Path]:
    """DeepSpeed's CPU accelerator JIT-builds its ops (the shared-memory all-reduce, under a minute) with torch's
    extension builder, whose lock file in the shared ``~/.cache/torch_extensions`` outlives a build that was killed,
    and every later build then waits on it forever: each test session builds into its own directory."""
    path = tmp_path_factory.mktemp("torch_extensions")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCH_EXTENSIONS_DIR", str(path))
        yield path


@pytest.fixture
def lightning_log(caplog: pytest.LogCaptureFixture, monkeypatch) -> Iterator[pytest.LogCaptureFixture]:
    """Capture ``rank_zero_info`` messages once each: whether the lightning.pytorch logger propagates to the root
    logger (where caplog listens) depends on what imported Lightning first, so its records go to caplog's handler
    directly, with propagation off for the test."""
    logger = logging.getLogger("lightning.pytorch")
    monkeypatch.setattr(logger, "propagate", False)
    logger.addHandler(caplog.handler)
    caplog.set_level(logging.INFO)
    yield caplog
    logger.removeHandler(caplog.handler)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """``tiny_model_dir(family)``: a saved tiny random model of that family with the tiny tokenizer (``width`` 32
    unless given)."""
    made = {}

    def make(family: str = "llama", num_layers: int = 4, width: int = 32) -> str:
        key = (family, num_layers, width)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}{num_layers}w{width}")
            tokenizer = build_tiny_tokenizer(path)
            model = tiny_model(family, num_layers, vocab_size=len(tokenizer), width=width)
            model.config.pad_token_id, model.config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
            model.config.bos_token_id = tokenizer.bos_token_id
            model.save_pretrained(path)
            made[key] = str(path)
        return made[key]

    return make


EXPORT_SCHEDULES = {
    "skipdecode": SkipDecode(max_layers=5, min_layers=2, decay_tokens=4),  # 5, 4, 3, 3, 2, 2, ... layers
    "ranked": Ranked(max_layers=5, min_layers=2, decay_tokens=4, ranking=(3, 1, 5, 2, 4, 0)),
    "hierarchical": Hierarchical(phase_boundaries=(0, 3), max_level=2),
}
"""The schedules :func:`skip_export` can export with, as the schedule families that build them."""


@pytest.fixture(scope="session")
def skip_export(tiny_model_dir, tmp_path_factory):
    """``skip_export(family, schedule="skipdecode")``: a merged export of a tiny 6-layer model with one of the
    :data:`EXPORT_SCHEDULES`."""
    from skiptrain.export.record import ExportRecord
    from skiptrain.export.write import write_export
    from skiptrain.modeling.loading import load_causal_lm, load_tokenizer

    made = {}

    def make(family: str, schedule: str = "skipdecode") -> Path:
        if (family, schedule) not in made:
            model_dir = tiny_model_dir(family, 6)
            target = tmp_path_factory.mktemp(f"export_{family}_{schedule}") / "export"
            built = EXPORT_SCHEDULES[schedule].build(6)
            write_export(load_causal_lm(model_dir), load_tokenizer(model_dir), built, target, ExportRecord(model_dir))
            made[family, schedule] = target
        return made[family, schedule]

    return make


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The project's shared real data (E2E, CNN/DailyMail, XSum, ...); skips where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it lies beside the checkout in development)")
    return SHARED_DATA
