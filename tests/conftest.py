import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (tiny_models, tiny_tokenizer) import by name

import pytest  # noqa: E402
from tiny_models import tiny_model  # noqa: E402
from tiny_tokenizer import build_tiny_tokenizer  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """``tiny_model_dir(family)``: a saved tiny random model of that family with the tiny tokenizer."""
    made = {}

    def make(family: str = "llama", num_layers: int = 4) -> str:
        key = (family, num_layers)
        if key not in made:
            path = tmp_path_factory.mktemp(f"{family}{num_layers}")
            tokenizer = build_tiny_tokenizer(path)
            model = tiny_model(family, num_layers, vocab_size=len(tokenizer))
            model.config.pad_token_id, model.config.eos_token_id = tokenizer.pad_token_id, tokenizer.eos_token_id
            model.config.bos_token_id = tokenizer.bos_token_id
            model.save_pretrained(path)
            made[key] = str(path)
        return made[key]

    return make


@pytest.fixture(scope="session")
def skip_export(tiny_model_dir, tmp_path_factory):
    """``skip_export(family)``: a merged export of a tiny 6-layer model with a SkipDecode schedule (5, 4, 3, 3, 2, 2,
    ... layers per generated token)."""
    from skiptrain.core.schedules import SkipDecode
    from skiptrain.export.record import ExportRecord
    from skiptrain.export.write import write_export
    from skiptrain.modeling.loading import load_causal_lm, load_tokenizer

    made = {}

    def make(family: str) -> Path:
        if family not in made:
            model_dir = tiny_model_dir(family, 6)
            target = tmp_path_factory.mktemp(f"export_{family}") / "export"
            schedule = SkipDecode(max_layers=5, min_layers=2, decay_tokens=4).build(6)
            write_export(load_causal_lm(model_dir), load_tokenizer(model_dir), schedule, target,
                         ExportRecord(model_dir))
            made[family] = target
        return made[family]

    return make


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The project's shared real data (E2E, CNN/DailyMail, XSum, ...); skips where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data folder {SHARED_DATA} is absent (it lies beside the checkout in development)")
    return SHARED_DATA
