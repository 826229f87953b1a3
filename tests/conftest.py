import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # test helpers (tiny_models, tiny_tokenizer) import by name
