"""Tests for skiptrain.data.datamodule, .tasks, .encoding, .batch and .builtin_task (offline, CPU, a few seconds)."""

from __future__ import annotations

import csv
import json
import os
import pickle
from pathlib import Path

import datasets
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

from helpers.tiny_tokenizer import build_tiny_tokenizer  # noqa: E402

from skiptrain.data.builtin_task import STYLES, build_builtin_dataset, format_mr, parse_mr, render, sample_record  # noqa: E402
from skiptrain.data.columns import (
    group_references,
    resolve_columns,  # noqa: E402
)
from skiptrain.data.datamodule import SkipDataModule  # noqa: E402
from skiptrain.data.loading import infer_builder
from skiptrain.modeling.forward import position_ids_from_mask
from skiptrain.modeling.loading import prepare_tokenizer  # noqa: E402
from skiptrain.text.batch import IGNORE_INDEX, Collator, collate  # noqa: E402
from skiptrain.text.encoding import encode_pairs, encode_prompts, group_into_blocks, special_token_counts  # noqa: E402
from skiptrain.text.tasks import TASKS, get_task_spec  # noqa: E402

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
E2E_TRAIN = SHARED_DATA / "e2e" / "subsets" / "trainset_64.csv"
E2E_TEST = SHARED_DATA / "e2e" / "subsets" / "testset_w_refs_8mr.csv"
CNN_VAL = SHARED_DATA / "cnn_dailymail" / "cnn_dailymail_validation_subset.csv"
XSUM_TEST = SHARED_DATA / "xsum" / "xsum_test_1000.jsonl"
WIKI_TEST = SHARED_DATA / "lm_text" / "wikitext-2-raw" / "wiki.test.raw"

PAD = 0
EOS = 2


def _require(path: Path) -> Path:
    if not path.exists():
        pytest.skip(f"shared data file {path} is not available on this machine")
    return path


def _read_csv(path: Path) -> list[dict[str, str]]:
    """Independent reference reader (the package itself goes through `datasets`)."""
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(autouse=True)
def _isolated_datasets_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep `datasets` cache files (from tmp files and the shared data) out of the user's cache."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", Path(tmp_path / "hf_datasets_cache"))


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def bos_tok():
    return build_tiny_tokenizer(add_bos=True)


def _dm(tokenizer, **kwargs) -> SkipDataModule:
    dm = SkipDataModule(**kwargs)
    dm.set_tokenizer(tokenizer)
    return dm


def _check_layout(batch: dict, pad_id: int) -> None:
    """Invariants of every batch: prompts end at column P, targets start at P, labels only on targets."""
    p = batch["prompt_length"]
    ids, mask, labels = batch["input_ids"], batch["attention_mask"], batch["labels"]
    assert ids.dtype == torch.long and ids.shape == mask.shape == labels.shape
    assert torch.equal(batch["prompt_input_ids"], ids[:, :p])
    assert torch.equal(batch["prompt_attention_mask"], mask[:, :p])
    if p > 0:
        assert mask[:, p - 1].all(), "every prompt must end at column P-1"
        # left padding: once a row's prompt starts, it continues to P
        assert (mask[:, 1:p] >= mask[:, : p - 1]).all()
    assert mask[:, p].all(), "every row has at least one target token at column P"
    # right padding of the target: no holes
    assert (mask[:, p + 1 :] <= mask[:, p:-1]).all()
    assert (labels[:, :p] == IGNORE_INDEX).all()
    assert torch.equal(labels[:, p:][mask[:, p:] == 1], ids[:, p:][mask[:, p:] == 1])
    assert (labels[mask == 0] == IGNORE_INDEX).all()
    assert (ids[mask == 0] == pad_id).all()


# ---------------------------------------------------------------------------------------------------------------
# Task table and arguments
# ---------------------------------------------------------------------------------------------------------------


def test_task_table_defaults() -> None:
    assert set(TASKS) == {"cnn_dailymail", "xsum", "reddit_tldr", "e2e_nlg", "text", "builtin", "messages", "sharegpt",
                          "alpaca", "prompt_completion"}
    assert (TASKS["cnn_dailymail"].dataset_id, TASKS["cnn_dailymail"].dataset_config) == (
        "abisee/cnn_dailymail",
        "3.0.0",
    )
    assert (TASKS["e2e_nlg"].source_column, TASKS["e2e_nlg"].target_column) == (
        "meaning_representation",
        "human_reference",
    )
    assert (TASKS["xsum"].source_column, TASKS["xsum"].target_column) == ("document", "summary")
    assert TASKS["text"].dataset_config == "wikitext-2-raw-v1" and TASKS["text"].is_language_modeling
    assert {name: spec.metric for name, spec in TASKS.items()} == {
        "cnn_dailymail": "rouge",
        "xsum": "rouge",
        "reddit_tldr": "rouge",
        "e2e_nlg": "bleu",
        "text": None,
        "builtin": "bleu",
        "messages": None,
        "sharegpt": None,
        "alpaca": None,
        "prompt_completion": None,
    }
    for spec in TASKS.values():
        if spec.prompt_template is not None:
            assert spec.prompt_template.count("{source}") == 1


def test_bad_task_names_field_value_and_choices() -> None:
    with pytest.raises(ValueError, match=r"task='summarise'.*allowed values.*cnn_dailymail.*xsum"):
        SkipDataModule(task="summarise")
    with pytest.raises(ValueError, match="task='nope'"):
        get_task_spec("nope")


def test_bad_template_and_sizes() -> None:
    with pytest.raises(ValueError, match=r"\{source\}"):
        SkipDataModule(task="xsum", prompt_template="Summarize:")
    with pytest.raises(ValueError, match="batch_size must be >= 1, got 0"):
        SkipDataModule(task="xsum", batch_size=0)


def test_metric_and_spec_exposed() -> None:
    dm = SkipDataModule(task="cnn_dailymail")
    assert dm.metric == "rouge" and dm.task_spec is TASKS["cnn_dailymail"] and dm.task == "cnn_dailymail"
    assert SkipDataModule(task="text").metric is None
    assert SkipDataModule(task="builtin").metric == "bleu"


def test_no_tokenizer_is_a_clear_error() -> None:
    dm = SkipDataModule(task="builtin")
    with pytest.raises(ValueError, match="set_tokenizer"):
        dm.setup("fit")


def test_tokenizer_by_path(tmp_path: Path) -> None:
    build_tiny_tokenizer(tmp_path / "tok", with_pad=False)
    dm = SkipDataModule(task="builtin", tokenizer=str(tmp_path / "tok"), max_train_samples=4, max_eval_samples=2)
    dm.setup("fit")
    assert dm.tokenizer.pad_token == "</s>"
    batch = next(iter(dm.train_dataloader()))
    _check_layout(batch, dm.tokenizer.pad_token_id)


# ---------------------------------------------------------------------------------------------------------------
# Collation
# ---------------------------------------------------------------------------------------------------------------

EXAMPLES = [
    {"prompt_ids": [11, 12, 13], "target_ids": [21, EOS], "source": "a", "references": ["r1", "r2"]},
    {"prompt_ids": [14], "target_ids": [22, 23, 24, EOS], "source": "b", "references": ["r3"]},
    {"prompt_ids": [15, 16], "target_ids": [EOS], "source": "c", "references": ["r4"]},
]


def test_collate_exact_layout() -> None:
    batch = collate(EXAMPLES, pad_token_id=PAD)
    assert batch["prompt_length"] == 3
    # T = 4 (longest target); row = left pads, prompt, target, right pads
    assert batch["input_ids"].tolist() == [
        [11, 12, 13, 21, EOS, PAD, PAD],
        [PAD, PAD, 14, 22, 23, 24, EOS],
        [PAD, 15, 16, EOS, PAD, PAD, PAD],
    ]
    assert batch["attention_mask"].tolist() == [
        [1, 1, 1, 1, 1, 0, 0],
        [0, 0, 1, 1, 1, 1, 1],
        [0, 1, 1, 1, 0, 0, 0],
    ]
    m = IGNORE_INDEX
    assert batch["labels"].tolist() == [
        [m, m, m, 21, EOS, m, m],
        [m, m, m, 22, 23, 24, EOS],
        [m, m, m, EOS, m, m, m],
    ]
    # the forward derives positions from the mask: they count real tokens only (left pads do not shift them; right
    # pads are never attended), so the batch carries no positions of its own
    assert "position_ids" not in batch
    assert position_ids_from_mask(batch["attention_mask"]).tolist() == [
        [0, 1, 2, 3, 4, 4, 4],
        [0, 0, 0, 1, 2, 3, 4],
        [0, 0, 1, 2, 2, 2, 2],
    ]
    assert batch["prompt_input_ids"].tolist() == [[11, 12, 13], [PAD, PAD, 14], [PAD, 15, 16]]
    assert batch["prompt_attention_mask"].tolist() == [[1, 1, 1], [0, 0, 1], [0, 1, 1]]
    assert batch["sources"] == ["a", "b", "c"]
    assert batch["references"] == [["r1", "r2"], ["r3"], ["r4"]]
    _check_layout(batch, PAD)


def test_collate_eos_as_pad_keeps_eos_labels() -> None:
    batch = collate(EXAMPLES, pad_token_id=EOS)
    # EOS targets are supervised even though EOS is also the pad id; pads are not.
    assert (batch["labels"] == EOS).sum().item() == 3
    assert batch["labels"][0].tolist()[-2:] == [IGNORE_INDEX, IGNORE_INDEX]


def test_collate_prompt_loss_labels_prompt_but_not_pads() -> None:
    batch = collate(EXAMPLES, pad_token_id=PAD, prompt_loss=True)
    m = IGNORE_INDEX
    assert batch["labels"].tolist() == [
        [11, 12, 13, 21, EOS, m, m],
        [m, m, 14, 22, 23, 24, EOS],
        [m, 15, 16, EOS, m, m, m],
    ]
    assert Collator(PAD, prompt_loss=True)(EXAMPLES)["labels"].tolist() == batch["labels"].tolist()


def test_collate_without_text_fields_and_empty() -> None:
    batch = collate([{"prompt_ids": [5], "target_ids": [6]}], pad_token_id=PAD)
    assert "references" not in batch and "sources" not in batch
    with pytest.raises(ValueError, match="empty"):
        collate([], pad_token_id=PAD)


def test_collator_is_picklable_for_workers() -> None:
    collator = pickle.loads(pickle.dumps(Collator(pad_token_id=7, prompt_loss=True)))
    assert collator == Collator(7, True)


def test_text_blocks_have_no_prompt() -> None:
    blocks = group_into_blocks([[1, 2, 3], [4, 5], [6, 7, 8, 9]], block_size=4)
    assert blocks == [[1, 2, 3, 4], [5, 6, 7, 8]]  # one-token tail dropped
    assert group_into_blocks([[1, 2, 3], [4, 5]], block_size=4) == [[1, 2, 3, 4]]
    assert group_into_blocks([[1, 2, 3]], block_size=2) == [[1, 2]]
    assert group_into_blocks([[1, 2, 3, 4, 5, 6]], block_size=4) == [[1, 2, 3, 4], [5, 6]]  # tail kept, padded later
    batch = collate([{"prompt_ids": [], "target_ids": b} for b in [[1, 2, 3, 4], [5, 6]]], pad_token_id=PAD)
    assert batch["prompt_length"] == 0
    assert batch["prompt_input_ids"].shape == (2, 0)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4], [5, 6, PAD, PAD]]
    assert batch["labels"].tolist() == [[1, 2, 3, 4], [5, 6, IGNORE_INDEX, IGNORE_INDEX]]


# ---------------------------------------------------------------------------------------------------------------
# Tokenisation and truncation
# ---------------------------------------------------------------------------------------------------------------

TEMPLATE = "Summarize the article.\n\nArticle: {source}\n\nSummary:"


def test_target_is_tokenised_in_context(tok) -> None:
    src, tgt = "The city council met on Monday.", "Council meets."
    prompt_ids, target_ids = encode_pairs(tok, TEMPLATE, [src], [tgt], 512, 64)
    full = tok(TEMPLATE.replace("{source}", src) + " " + tgt)["input_ids"]
    assert prompt_ids[0] + target_ids[0][:-1] == full
    assert target_ids[0][-1] == tok.eos_token_id
    assert tok.decode(target_ids[0]) == " Council meets.</s>"


def test_truncation_trims_source_keeps_template_and_target(tok) -> None:
    long_source = " ".join(["The council discussed the budget for the new bridge."] * 60)
    target = "The council met to discuss the budget for the bridge."
    short = "A short story."
    prompt_ids, target_ids = encode_pairs(tok, TEMPLATE, [long_source, short], [target, target], 64, 128)
    assert len(tok(TEMPLATE.replace("{source}", long_source))["input_ids"]) > 300
    assert 56 <= len(prompt_ids[0]) <= 64
    text = tok.decode(prompt_ids[0])
    assert text.startswith("Summarize the article.\n\nArticle: The council discussed the budget")
    assert text.endswith("\n\nSummary:")  # the template's tail is never cut
    assert text.replace("Summarize the article.\n\nArticle: ", "").replace("\n\nSummary:", "") in long_source
    # the target is untouched; the short prompt is not truncated
    assert target_ids[0] == target_ids[1]
    assert tok.decode(target_ids[0]) == " " + target + "</s>"
    assert prompt_ids[1] == tok(TEMPLATE.replace("{source}", short))["input_ids"]


def test_truncation_counts_bos_and_caps_target(bos_tok) -> None:
    assert special_token_counts(bos_tok) == (1, 0)
    source = "fog rain snow sunshine " * 50
    prompt_ids, target_ids = encode_pairs(bos_tok, TEMPLATE, [source], ["one two three four five six seven"], 40, 3)
    assert prompt_ids[0][0] == bos_tok.bos_token_id
    assert prompt_ids[0].count(bos_tok.bos_token_id) == 1
    assert len(prompt_ids[0]) <= 40
    assert bos_tok.decode(prompt_ids[0], skip_special_tokens=True).endswith("\n\nSummary:")
    assert len(target_ids[0]) == 4 and target_ids[0][-1] == bos_tok.eos_token_id
    assert target_ids[0][:3] == bos_tok(" one two three four", add_special_tokens=False)["input_ids"][:3]


def test_template_longer_than_budget_is_an_error(tok) -> None:
    with pytest.raises(ValueError, match="max_source_tokens=5"):
        encode_prompts(tok, TEMPLATE, ["x"], 5)


def test_identity_template_for_preformatted_prompts(tok) -> None:
    texts, ids = encode_prompts(tok, "{source}", ["POST: hi there\nTL;DR:"], 100)
    assert texts == ["POST: hi there\nTL;DR:"]
    assert tok.decode(ids[0]) == "POST: hi there\nTL;DR:"


# ---------------------------------------------------------------------------------------------------------------
# Tokenizer handling
# ---------------------------------------------------------------------------------------------------------------


def test_tokenizer_without_pad_uses_eos(lightning_log) -> None:
    no_pad = build_tiny_tokenizer(with_pad=False)
    assert no_pad.pad_token is None
    dm = _dm(no_pad, task="builtin", batch_size=3, max_train_samples=6, max_eval_samples=2)
    assert no_pad.pad_token == "</s>" and no_pad.pad_token_id == no_pad.eos_token_id
    assert any("no pad token" in r.getMessage() and "'</s>'" in r.getMessage() for r in lightning_log.records)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    _check_layout(batch, no_pad.eos_token_id)
    # every row's EOS target is supervised although EOS is the pad id
    assert ((batch["labels"] == no_pad.eos_token_id).sum(dim=1) == 1).all()


def test_tokenizer_without_eos_is_an_error() -> None:
    bare = build_tiny_tokenizer(with_pad=False)
    bare.eos_token = None
    with pytest.raises(ValueError, match="no eos_token"):
        prepare_tokenizer(bare)


# ---------------------------------------------------------------------------------------------------------------
# Multi-reference grouping
# ---------------------------------------------------------------------------------------------------------------


def test_group_references_preserves_order() -> None:
    sources, refs = group_references(["b", "a", "b", "c", "a", "b"], ["b1", "a1", "b2", "c1", "a2", "b3"])
    assert sources == ["b", "a", "c"]
    assert refs == [["b1", "b2", "b3"], ["a1", "a2"], ["c1"]]
    with pytest.raises(ValueError):
        group_references(["a"], [])


def test_e2e_eval_grouped_train_pairs(tmp_path: Path, tok) -> None:
    rows = [("name[A], food[Thai]", "A serves Thai."), ("name[B]", "B."), ("name[A], food[Thai]", "Thai at A.")]
    path = tmp_path / "dev.csv"
    with open(path, "w", encoding="utf-8", newline="") as f:
        csv.writer(f).writerows([("mr", "ref"), *rows])
    dm = _dm(tok, task="e2e_nlg", data_files={"train": str(path), "validation": str(path)}, batch_size=8)
    dm.setup("fit")
    assert len(dm.datasets["train"]) == 3  # one example per (mr, ref) pair
    assert len(dm.datasets["val"]) == 2
    batch = next(iter(dm.val_dataloader()))
    assert batch["sources"] == ["name[A], food[Thai]", "name[B]"]
    assert batch["references"] == [["A serves Thai.", "Thai at A."], ["B."]]
    _check_layout(batch, tok.pad_token_id)
    # validation loss target = first reference
    p = batch["prompt_length"]
    first_target = batch["input_ids"][0, p:][batch["attention_mask"][0, p:] == 1]
    assert tok.decode(first_target) == " A serves Thai.</s>"


# ---------------------------------------------------------------------------------------------------------------
# Local files
# ---------------------------------------------------------------------------------------------------------------

ROWS = [
    {"doc": "The museum opened in 1990 and attracts many visitors.", "summ": "Museum is popular.", "x": 1},
    {"doc": "Police arrested a man after the incident.", "summ": "Man arrested.", "x": 2},
    {"doc": "Scientists found a new frog.", "summ": "New frog found.", "x": 3},
]


def _write(path: Path, rows: list[dict]) -> Path:
    if path.suffix == ".csv":
        with open(path, "w", encoding="utf-8", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    elif path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    elif path.suffix == ".parquet":
        datasets.Dataset.from_list(rows).to_parquet(str(path))
    else:
        raise AssertionError(path)
    return path


@pytest.mark.parametrize("ext", [".csv", ".jsonl", ".parquet"])
def test_local_files_with_column_mapping(tmp_path: Path, tok, ext: str) -> None:
    path = _write(tmp_path / f"data{ext}", ROWS)
    dm = _dm(
        tok,
        task="xsum",
        data_files={"train": str(path), "test": str(path)},
        source_column="doc",
        target_column="summ",
        batch_size=2,
    )
    dm.setup("test")
    batch = next(iter(dm.test_dataloader()))
    assert batch["sources"] == [ROWS[0]["doc"], ROWS[1]["doc"]]
    assert batch["references"] == [[ROWS[0]["summ"]], [ROWS[1]["summ"]]]
    prompt = tok.decode(batch["prompt_input_ids"][1], skip_special_tokens=True)
    assert prompt == "Summarize the article in one sentence.\n\nArticle: " + ROWS[1]["doc"] + "\n\nSummary:"
    _check_layout(batch, tok.pad_token_id)
    dm.setup("fit")  # no validation file: one of the three rows is held out for validation
    assert len(dm.datasets["train"]) == 2 and dm.datasets["train"].column_names == ["prompt_ids", "target_ids"]
    assert len(dm.datasets["val"]) == 1
    no_holdout = _dm(tok, task="xsum", data_files={"train": str(path)}, source_column="doc", target_column="summ",
                     val_share=0)
    with pytest.warns(UserWarning, match="no val data: split 'validation' not in data_files"):
        no_holdout.setup("fit")
    assert len(no_holdout.datasets["train"]) == 3
    assert no_holdout.val_dataloader() == []  # Lightning skips validation


def test_infer_builder() -> None:
    assert infer_builder("a.jsonl") == ("json", {})
    assert infer_builder(["a.csv", "b.csv"])[0] == "csv"
    assert infer_builder("wiki.test.raw") == ("text", {"keep_linebreaks": True})
    with pytest.raises(ValueError, match=r"'\.xlsx'"):
        infer_builder("a.xlsx")
    with pytest.raises(ValueError, match="mix formats"):
        infer_builder(["a.csv", "b.jsonl"])


def test_missing_column_names_file_column_and_found(tmp_path: Path, tok) -> None:
    path = _write(tmp_path / "cnn.csv", [{"article": "Some text here.", "summary": "Text.", "id": "1"}])
    dm = _dm(tok, task="cnn_dailymail", data_files={"train": str(path)})
    with pytest.raises(ValueError) as err:
        dm.setup("fit")
    message = str(err.value)
    assert str(path) in message
    assert "'highlights'" in message
    assert "['article', 'summary', 'id']" in message
    dm = _dm(tok, task="cnn_dailymail", data_files={"train": str(path)}, source_column="body", target_column="summary")
    with pytest.raises(
        ValueError, match=r"missing column\(s\) \['body'\].*columns found: \['article', 'summary', 'id'\]"
    ):
        dm.setup("fit")


def test_resolve_columns_aliases() -> None:
    spec = TASKS["e2e_nlg"]
    assert resolve_columns(["mr", "ref"], spec, "f.csv") == ("mr", "ref")
    assert resolve_columns(["meaning_representation", "human_reference"], spec, "hub") == (
        "meaning_representation",
        "human_reference",
    )
    assert resolve_columns(["text", "id"], TASKS["text"], "f") == ("text", None)


@pytest.mark.parametrize("content", ["", "mr,ref\n"], ids=["zero-bytes", "header-only"])
def test_empty_split_is_named(tmp_path: Path, tok, content: str) -> None:
    train = tmp_path / "train.csv"
    train.write_text("mr,ref\nname[A],A.\n", encoding="utf-8")
    empty = tmp_path / "dev.csv"
    empty.write_text(content, encoding="utf-8")
    dm = _dm(tok, task="e2e_nlg", data_files={"train": str(train), "validation": str(empty)})
    with pytest.raises(ValueError, match=r"split 'validation' is empty"):
        dm.setup("fit")


def test_empty_rows_dropped_and_counted(tmp_path: Path, tok, lightning_log) -> None:
    path = tmp_path / "train.csv"
    path.write_text('mr,ref\nname[A],A is good.\nname[B],\n,orphan\n"  ",blank\nname[C],NA\n', encoding="utf-8")
    dm = _dm(tok, task="e2e_nlg", data_files={"train": str(path)}, val_share=0)
    with pytest.warns(UserWarning, match="no val data"):
        dm.setup("fit")
    assert len(dm.datasets["train"]) == 2  # "NA" is text, not a missing value
    assert any("dropped 3 of 5 rows" in r.getMessage() for r in lightning_log.records)
    all_empty = tmp_path / "empty_text.csv"
    all_empty.write_text("mr,ref\nname[A],\n", encoding="utf-8")
    dm = _dm(tok, task="e2e_nlg", data_files={"train": str(all_empty)})
    with pytest.raises(ValueError, match=r"split 'train' has no usable rows"):
        dm.setup("fit")


def test_missing_split_and_file(tmp_path: Path, tok) -> None:
    path = _write(tmp_path / "v.csv", ROWS)
    dm = _dm(tok, task="xsum", data_files={"validation": str(path)}, source_column="doc", target_column="summ")
    with pytest.raises(KeyError, match=r"split 'train' not in data_files \(available: \['validation'\]\)"):
        dm.setup("fit")
    dm = _dm(tok, task="xsum", data_files={"train": str(tmp_path / "nope.csv")})
    with pytest.raises(FileNotFoundError, match="nope.csv"):
        dm.setup("fit")


def test_text_task_local_file(tmp_path: Path, tok) -> None:
    text = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\n" for i in range(40))
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    dm = _dm(tok, task="text", data_files={"train": str(path), "validation": str(path)}, block_size=32, batch_size=4)
    dm.setup("fit")
    blocks = dm.datasets["val"]["target_ids"]
    assert all(len(b) == 32 for b in blocks[:-1]) and 2 <= len(blocks[-1]) <= 32
    assert tok.decode([t for b in blocks for t in b]) == text  # nothing lost, line breaks kept
    batch = next(iter(dm.train_dataloader()))
    assert batch["prompt_length"] == 0 and batch["input_ids"].shape == (4, 32)
    real = batch["attention_mask"].bool()  # the last, shorter block is right-padded
    assert torch.equal(batch["labels"][real], batch["input_ids"][real])
    assert (batch["labels"][~real] == -100).all()
    assert "references" not in batch


def test_shuffle_is_seeded(tok) -> None:
    def first_batch(seed: int) -> list[list[int]]:
        dm = _dm(tok, task="builtin", batch_size=4, seed=seed, max_train_samples=64)
        dm.setup("fit")
        return next(iter(dm.train_dataloader()))["input_ids"].tolist()

    assert first_batch(0) == first_batch(0)
    assert first_batch(0) != first_batch(1)


def _epoch_batches(loader) -> list[list[list[int]]]:
    return [batch["input_ids"].tolist() for batch in loader]


def test_a_resumed_position_continues_the_epoch_order_then_later_epochs_are_whole(tok) -> None:
    def loader(state: dict | None = None):
        dm = _dm(tok, task="builtin", batch_size=4, seed=5, max_train_samples=16)
        dm.setup("fit")
        if state is not None:
            dm.load_state_dict(state)
        return dm.train_dataloader()

    uninterrupted = loader()
    uninterrupted.sampler.set_epoch(1)
    epoch_1 = _epoch_batches(uninterrupted)
    uninterrupted.sampler.set_epoch(2)
    epoch_2 = _epoch_batches(uninterrupted)
    resumed = loader({"epoch": 1, "batches": 3})  # built before Lightning sets the sampler's epoch
    assert _epoch_batches(resumed) == epoch_1[3:] and len(epoch_1) == 4
    resumed.sampler.set_epoch(2)
    assert _epoch_batches(resumed) == epoch_2 != epoch_1
    assert _epoch_batches(loader({"epoch": 2, "batches": 0})) == epoch_2  # an epoch boundary: no batch skipped


def test_a_position_restored_after_the_loader_was_built_restarts_the_epoch_and_says_so(tok) -> None:
    dm = _dm(tok, task="builtin", batch_size=4, seed=5, max_train_samples=16)
    dm.setup("fit")
    first = _epoch_batches(dm.train_dataloader())
    with pytest.warns(UserWarning, match="resuming epoch 0 after batch 2: this strategy loads checkpoints after"):
        dm.load_state_dict({"epoch": 0, "batches": 2})
    assert _epoch_batches(dm.train_dataloader()) == first


# ---------------------------------------------------------------------------------------------------------------
# Builtin task
# ---------------------------------------------------------------------------------------------------------------


def test_builtin_deterministic_and_layout() -> None:
    a = build_builtin_dataset(num_train=50, num_validation=10, num_test=10, seed=3)
    b = build_builtin_dataset(num_train=50, num_validation=10, num_test=10, seed=3)
    c = build_builtin_dataset(num_train=50, num_validation=10, num_test=10, seed=4)
    for split in ("train", "validation", "test"):
        assert a[split].to_dict() == b[split].to_dict()
        assert a[split].column_names == ["mr", "ref"]
    assert a["train"]["ref"] != c["train"]["ref"]
    assert len(a["train"]) == 50
    train_mrs = set(a["train"]["mr"])
    assert len(train_mrs) == 50
    for split in ("validation", "test"):
        mrs, refs = group_references(a[split]["mr"], a[split]["ref"])
        assert len(mrs) == 10 and not train_mrs & set(mrs)
        assert all(2 <= len(r) <= 4 and len(set(r)) == len(r) for r in refs)
        assert len(a[split]) == sum(len(r) for r in refs)
    assert not set(group_references(a["validation"]["mr"], a["validation"]["ref"])[0]) & set(a["test"]["mr"])


def test_builtin_records_and_renderings() -> None:
    import random

    rng = random.Random(0)
    for _ in range(200):
        record = sample_record(rng)
        attrs = parse_mr(format_mr(record))
        assert 3 <= len(attrs) <= 6
        assert attrs == record.attributes()
        if record.high is not None and record.low is not None:
            assert record.low < record.high
        for style in range(len(STYLES)):
            text = render(record, style)
            assert record.city in text and record.day in text
            assert text.endswith(".") and 1 <= text.count(". ") + 1 <= 2
            for key in ("high", "low", "rain"):
                if key in attrs:
                    assert attrs[key] in text, (key, text)
    assert render(sample_record(random.Random(5)), 0) == render(sample_record(random.Random(5)), 0)
    assert parse_mr("name[The Eagle], eatType[coffee shop]") == {"name": "The Eagle", "eatType": "coffee shop"}


def test_builtin_datamodule(tok) -> None:
    dm = _dm(tok, task="builtin", batch_size=8, eval_batch_size=5)
    dm.setup("fit")
    dm.setup("test")
    assert len(dm.datasets["train"]) == 2000
    assert len(dm.datasets["val"]) == 100 and len(dm.datasets["test"]) == 100
    val = next(iter(dm.val_dataloader()))
    assert len(val["references"]) == 5 and all(2 <= len(r) <= 4 for r in val["references"])
    _check_layout(val, tok.pad_token_id)
    prompt = tok.decode(val["prompt_input_ids"][0], skip_special_tokens=True)
    assert prompt == f"Write the weather forecast.\nData: {val['sources'][0]}\nForecast:"
    predict = next(iter(dm.predict_dataloader()))
    assert predict["sources"] == next(iter(dm.test_dataloader()))["sources"]
    _check_layout(next(iter(dm.train_dataloader())), tok.pad_token_id)


# ---------------------------------------------------------------------------------------------------------------
# Real data in ../shared/data beside the checkout (skipped when absent)
# ---------------------------------------------------------------------------------------------------------------


def test_real_e2e(tok) -> None:
    train_path, test_path = _require(E2E_TRAIN), _require(E2E_TEST)
    train_rows, test_rows = _read_csv(train_path), _read_csv(test_path)
    dm = _dm(tok, task="e2e_nlg", data_files={"train": str(train_path), "test": str(test_path)}, eval_batch_size=8,
             val_share=0)  # every training row trains
    with pytest.warns(UserWarning, match="no val data"):
        dm.setup("fit")
    dm.setup("test")
    assert len(dm.datasets["train"]) == len(train_rows) == 64
    first = dm.datasets["train"][0]  # not shuffled in storage; the loader shuffles
    assert tok.decode(first["target_ids"]) == " " + train_rows[0]["ref"].strip() + "</s>"
    assert tok.decode(first["prompt_ids"]) == TASKS["e2e_nlg"].prompt_template.replace("{source}", train_rows[0]["mr"])
    batch = next(iter(dm.test_dataloader()))
    expected_sources, expected_refs = group_references([r["mr"] for r in test_rows], [r["ref"] for r in test_rows])
    assert len(expected_sources) == 8 and sum(len(r) for r in expected_refs) == 51
    assert batch["sources"] == expected_sources
    assert batch["references"] == expected_refs
    assert batch["references"][0][0] == "Cocum is a pub near Express by Holiday Inn with food at low prices."
    _check_layout(batch, tok.pad_token_id)


def test_real_cnn_dailymail(tok) -> None:
    path = _require(CNN_VAL)
    rows = _read_csv(path)[:4]
    dm = _dm(
        tok,
        task="cnn_dailymail",
        data_files={"validation": str(path)},
        max_eval_samples=4,
        max_source_tokens=200,
        max_target_tokens=48,
        eval_batch_size=4,
    )
    dm.setup("validate")
    assert len(dm.datasets["val"]) == 4
    batch = next(iter(dm.val_dataloader()))
    assert batch["sources"] == [r["article"] for r in rows]
    assert batch["references"] == [[r["highlights"]] for r in rows]
    assert batch["prompt_length"] == 200  # articles are far longer than 200 tokens: all trimmed to the budget
    for i in range(4):
        prompt = tok.decode(batch["prompt_input_ids"][i], skip_special_tokens=True)
        assert prompt.startswith("Summarize the article.\n\nArticle: " + rows[i]["article"][:20])
        assert prompt.endswith("\n\nSummary:")
    target_lengths = batch["attention_mask"][:, 200:].sum(dim=1)
    assert (target_lengths <= 49).all() and (target_lengths == 49).any()
    _check_layout(batch, tok.pad_token_id)


def test_real_xsum(tok) -> None:
    path = _require(XSUM_TEST)
    with open(path, encoding="utf-8") as f:
        rows = [json.loads(next(f)) for _ in range(3)]
    assert set(rows[0]) == {"document", "summary"}
    dm = _dm(tok, task="xsum", data_files={"test": str(path)}, max_eval_samples=3, max_source_tokens=256)
    dm.setup("test")
    assert len(dm.datasets["test"]) == 3
    batch = next(iter(dm.test_dataloader()))
    assert batch["sources"] == [r["document"].strip() for r in rows]
    assert batch["references"] == [[r["summary"].strip()] for r in rows]
    assert batch["prompt_length"] <= 256
    _check_layout(batch, tok.pad_token_id)


def test_real_wikitext_blocks(tok) -> None:
    path = _require(WIKI_TEST)
    dm = _dm(tok, task="text", data_files={"test": str(path)}, block_size=256, max_eval_samples=6, eval_batch_size=3)
    dm.setup("test")
    assert len(dm.datasets["test"]) == 6
    batch = next(iter(dm.test_dataloader()))
    assert batch["prompt_length"] == 0 and batch["input_ids"].shape == (3, 256)
    assert torch.equal(batch["labels"], batch["input_ids"])
    assert tok.decode(batch["input_ids"][0]).startswith(" = Robert Boulter = \n")
