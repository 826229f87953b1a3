"""The conformance kit: ``skiptrain conformance`` writes test vectors from an export and checks an engine's output
against them. Its first client is plain transformers ``generate()`` through the export's ``custom_generate``."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from skiptrain.cli.app import main
from skiptrain.core.schedules import Dense
from skiptrain.export.format import schedule_from_export
from skiptrain.frontends.conformance import ConformanceError, check_outputs, read_outputs, read_vectors

PROMPTS = ["The council met on Monday", "Describe the restaurant in one sentence. Attributes: name[The Eagle]",
           "Expect sunshine in Lisbon"]
NEW_TOKENS = 8
CPU = ["--trainer.accelerator", "cpu", "--trainer.logger", "false"]


def engine_outputs(model, vectors: dict, path, **options) -> None:
    """Decode every case's prompt ids alone (batch 1), with ``generate`` ``options``, and write the engine's JSON
    lines."""
    lines = []
    for case in vectors["cases"]:
        ids = model.generate(input_ids=torch.tensor([case["prompt_token_ids"]]), do_sample=False,
                             max_new_tokens=vectors["max_new_tokens"], eos_token_id=None, **options)
        lines.append(json.dumps({"id": case["id"], "token_ids": ids[0, len(case["prompt_token_ids"]):].tolist()}))
    path.write_text("\n".join(lines) + "\n")


def test_transformers_custom_generate_passes_and_dense_decoding_fails(skip_export, tmp_path):
    export = skip_export("llama")
    prompts, vectors_file = tmp_path / "prompts.txt", tmp_path / "vectors.json"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    main(["conformance", "--model.model", str(export), "--prompts", str(prompts), "--vectors", str(vectors_file),
          "--max_new_tokens", str(NEW_TOKENS), "--batch_size", "3", *CPU])
    vectors = read_vectors(vectors_file)
    assert vectors["skip_schedule"] == {k: v for k, v in schedule_from_export(export)[1].items()
                                        if k in vectors["skip_schedule"]}
    assert [c["prompt"] for c in vectors["cases"]] == PROMPTS
    assert all(len(c["token_ids"]) == NEW_TOKENS == len(c["top_logits"]) for c in vectors["cases"])
    assert all(step[0][0] == token for c in vectors["cases"] for step, token in zip(c["top_logits"], c["token_ids"],
                                                                                     strict=True))
    check = ["conformance", "--model.model", str(export), "--vectors", str(vectors_file), *CPU]

    engine = tmp_path / "hf_custom_generate.jsonl"
    engine_outputs(AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval(), vectors, engine)
    report = check_outputs(vectors, read_outputs(engine))
    assert report.passed and report.cases == 3, report.summary()
    main([*check, "--check", str(engine)])  # the subcommand passes too

    dense = tmp_path / "hf_dense.jsonl"
    engine_outputs(AutoModelForCausalLM.from_pretrained(export).eval(), vectors, dense)
    with pytest.raises(SystemExit, match=r"conformance FAIL: \d of 3 cases.*\nfirst divergence: case \d, generated "
                                         r"index \d: expected token \d+, got \d+"):
        main([*check, "--check", str(dense)])


def test_lossless_vectors_pass_speculative_and_full_depth_decoding_and_fail_the_schedule(skip_export, tmp_path):
    """Vectors for a speculative implementation: its output must be the full-depth output, whatever it drafts with."""
    export = skip_export("llama")
    vectors_file = tmp_path / "vectors.json"
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    main(["conformance", "--model.model", str(export), "--prompts", str(tmp_path / "prompts.txt"), "--vectors",
          str(vectors_file), "--max_new_tokens", str(NEW_TOKENS), "--lossless", "true", *CPU])
    vectors = read_vectors(vectors_file, schedule_from_export(export)[0])
    assert vectors["reference"] == "full_depth"
    skip = AutoModelForCausalLM.from_pretrained(export, trust_remote_code=True).eval()
    for name, model, options in (("speculative", skip, {"speculative_tokens": 3}),
                                 ("full depth", AutoModelForCausalLM.from_pretrained(export).eval(), {}),
                                 ("schedule", skip, {})):
        engine_outputs(model, vectors, tmp_path / "engine.jsonl", **options)
        report = check_outputs(vectors, read_outputs(tmp_path / "engine.jsonl"))
        assert report.passed is (name != "schedule"), (name, report.summary())


def synthetic_vectors() -> dict:
    top = [[[5, 2.0], [7, 1.9995], [3, 1.0]], [[6, 1.0], [8, 0.5], [3, 0.1]]]
    return {"margin": 1e-3, "cases": [{"id": 0, "token_ids": [5, 6], "top_logits": top}]}


@pytest.mark.parametrize(("got", "margin", "passed", "message"), [
    ([5, 6], None, True, "1 of 1 cases agree with the reference (0 of them up to a tie within 0.001)"),
    ([7, 9], None, True, "(1 of them up to a tie within 0.001)"),
    ([7, 6], 1e-4, False, "generated index 0: expected token 5, got 7 (its reference logit is 0.0005 below"),
    ([5, 8], None, False, "generated index 1: expected token 6, got 8 (its reference logit is 0.5 below"),
    ([5, 9], None, False, "got 9 (it is not among the reference's top logits)"),
    ([5], None, False, "case 0: the engine's output ends before generated index 1"),
    (None, None, False, "the engine's output ends before generated index 0"),
])
def test_a_tie_within_the_margin_passes_and_the_first_divergence_is_reported(got, margin, passed, message):
    report = check_outputs(synthetic_vectors(), {} if got is None else {0: got}, margin)
    assert report.passed is passed
    assert message in report.summary()


def test_unreadable_files_are_refused_naming_the_line(skip_export, tmp_path):
    outputs = tmp_path / "engine.jsonl"
    outputs.write_text('{"id": 0, "token_ids": [1]}\n{"id": 0, "token_ids": [2]}\n')
    with pytest.raises(ConformanceError, match="engine.jsonl line 2: allowed one object per case"):
        read_outputs(outputs)
    outputs.write_text('{"id": 0, "token_ids": [1]}\nnot json\n')
    with pytest.raises(ConformanceError, match="engine.jsonl line 2: not valid JSON"):
        read_outputs(outputs)
    vectors = tmp_path / "vectors.json"
    vectors.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ConformanceError, match="is not a conformance vectors file: allowed format='skiptrain"):
        read_vectors(vectors)
    other = {"format": "skiptrain.conformance", "version": 1, "skip_schedule": Dense().build(6).to_dict()}
    vectors.write_text(json.dumps(other))
    with pytest.raises(ConformanceError, match="was written for another schedule than .*skip_schedule.json"):
        read_vectors(vectors, schedule_from_export(skip_export("llama"))[0])
