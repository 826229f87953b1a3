"""A share's paired bootstrap interval: per-article scores that average to score.py's corpus scores, resampled
together so that the interval reflects how differently two rows score the same articles."""

import json
from pathlib import Path

import pytest
import torch

from benchmarks.quality import paired
from benchmarks.quality.score import quality

ROOT = Path(__file__).resolve().parents[1]
REFERENCES = [["The cat sat on the mat all day ."],
              ["Heavy rain up north .", "Rain is expected tomorrow in the north of England ."],  # the best is second
              ["Shares rose after the bank cut its rates ."]]
PREDICTIONS = ["A cat sat on a mat .", "Rain is expected tomorrow in the north .", "The bank cut rates ."]


@pytest.mark.parametrize("metric", sorted(paired.METRICS))
def test_article_scores_average_to_the_corpus_score(metric):
    scores = paired.article_scores(PREDICTIONS, REFERENCES, metric)
    assert len(set(scores.tolist())) == 3  # the articles score differently, so the mean is a real check
    assert scores.mean().item() == pytest.approx(quality(PREDICTIONS, REFERENCES)[metric], abs=1e-6)


def test_rows_scoring_alike_have_a_share_of_one_and_no_spread():
    scores = torch.tensor([0.1, 0.5, 0.3, 0.2])
    result = paired.paired_share(scores, scores.clone(), resamples=500)
    assert (result.share, result.low, result.high) == (pytest.approx(1.0), pytest.approx(1.0), pytest.approx(1.0))
    assert (result.better, result.equal, result.worse) == (0, 4, 0)


def test_the_interval_follows_the_pairs_not_the_spread_between_articles():
    dense = torch.linspace(0.05, 0.6, 40)  # articles differ widely
    result = paired.paired_share(0.9 * dense, dense, resamples=2000)
    # every article keeps 90%: resampling articles together leaves no doubt; resampling each row on its own would
    assert result.low == pytest.approx(0.9, abs=1e-6) and result.high == pytest.approx(0.9, abs=1e-6)
    assert result.worse == 40
    unpaired = paired.paired_share(0.9 * dense, dense.flip(0), resamples=2000)  # the same scores, other pairs
    assert unpaired.share == pytest.approx(0.9) and unpaired.high - unpaired.low > 0.2


def test_more_articles_narrow_the_interval_around_the_share():
    generator = torch.Generator().manual_seed(1)
    dense = torch.rand(400, generator=generator) * 0.5 + 0.1
    skip = dense * (0.9 + 0.3 * (torch.rand(400, generator=generator) - 0.5))
    few, many = paired.paired_share(skip[:40], dense[:40]), paired.paired_share(skip, dense)
    for result in (few, many):
        assert result.low < result.share < result.high
    assert many.high - many.low < 0.5 * (few.high - few.low)


def test_unequal_rows_are_refused():
    with pytest.raises(ValueError, match="two equal, non-empty vectors"):
        paired.paired_share(torch.rand(3), torch.rand(4))


def test_a_committed_comparison_averages_to_its_rows_scores(shared_data, monkeypatch, capsys):
    """On the committed CNN/DailyMail test outputs of two seeds a side: each side's mean is the mean of its rows'
    committed ROUGE-L."""
    monkeypatch.chdir(ROOT)
    skip, dense = ["flat2x+lora_all_r64", "flat2x+lora_all_r64_s1"], ["dense+lora_all_r64", "dense+lora_all_r64_s1"]
    paired.main(["cnndm", "--skip", *skip, "--dense", *dense, "--split", "test", "--resamples", "200"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    committed = {name: json.loads((ROOT / f"benchmarks/results/cnndm/study/{name}.test.json").read_text())["rouge_l"]
                 for name in skip + dense}
    means = [sum(committed[name] for name in side) / 2 for side in (skip, dense)]
    assert f"{' '.join(skip)} {100 * means[0]:.1f} against {' '.join(dense)} {100 * means[1]:.1f}" in line
    assert "200 articles" in line and f"share {100 * means[0] / means[1]:.1f}%" in line


def test_a_row_without_outputs_is_refused_in_one_line(monkeypatch):
    monkeypatch.chdir(ROOT)
    with pytest.raises(SystemExit, match="row 'flat9x' has no dev outputs"):
        paired.predictions_of("cnndm", "flat9x", "dev")
