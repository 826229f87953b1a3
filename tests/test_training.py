"""The product users run: LightningCLI recipes, in-process fit/validate/resume on tiny models."""

import csv
import json
import re
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
import yaml
from helpers.cli_args import read_metrics, tiny_args
from helpers.exports import EXPORT_CALLBACK, PROMPTS, left_padded
from helpers.interrupt import SimulatedCrash

from benchmarks.quality.study_report import row_configs, seedless, study_env
from skiptrain import load_exported, skip_forward
from skiptrain.cli.app import main
from skiptrain.cli.progress import ProgressBar
from skiptrain.modeling.architectures import activation_checkpointing_on
from skiptrain.modeling.loading import load_causal_lm, load_tokenizer
from skiptrain.modeling.precision import weights_dtype
from skiptrain.training.metrics import EvaluationMetrics, generation_scores
from skiptrain.training.module import SkipLM

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "recipes").rglob("*.yaml"))


def recipe_configs(path: Path) -> list[str]:
    """The ``--config`` chain for a recipe: fragments name their base recipe(s) in a ``# base:`` line."""
    base = re.search(r"^# base: (.+)$", path.read_text(), re.MULTILINE)
    chain = [str(ROOT / b) for b in base.group(1).split()] if base else []
    configs = []
    for item in [*chain, str(path)]:
        configs += ["--config", item]
    return configs


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: str(p.relative_to(ROOT / "recipes")))
def test_every_recipe_parses_against_the_cli(recipe):
    if "DeepSpeedStrategy" in recipe.read_text() and find_spec("deepspeed") is None:
        pytest.skip(f"{recipe.name} uses DeepSpeed, the optional extra: pip install 'skiptrain[deepspeed]'")
    if "quantization:" in recipe.read_text() and find_spec("bitsandbytes") is None:
        pytest.skip(f"{recipe.name} quantizes with bitsandbytes, the optional extra: pip install 'skiptrain[qlora]'")
    cli = _parse(recipe_configs(recipe))
    assert cli.model.schedule_family is not None
    assert cli.datamodule.tokenizer_name == cli.model.model_name, "tokenizer is linked from the model"


def _parse(args: list[str]):
    """Parse and instantiate (no weights are loaded before ``configure_model``) without running."""
    return main(args, run=False)


def test_fragments_override_only_what_they_name():
    cli = _parse(recipe_configs(ROOT / "recipes/fragments/opt6.7b_3x.yaml"))
    family = cli.model.schedule_family
    assert (family.max_layers, family.min_layers, family.decay_tokens) == (16, 4, 100)


def test_unknown_keys_fail_at_parse_time(capsys):
    with pytest.raises(SystemExit):
        _parse(["--config", str(ROOT / "recipes/quickstart.yaml"), "--model.schedule.init_args.min_layer", "3"])
    assert "min_layer" in capsys.readouterr().err


def write_summaries(path: Path) -> Path:
    rows = [(f"The council of town {i} met on Monday and agreed a new budget for roads and schools.",
             f"Town {i} agreed a budget.") for i in range(12)]
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["article", "highlights"])
        writer.writerows(rows)
    return path


@pytest.mark.parametrize("task", ["builtin", "summarisation", "text"])
def test_fit_fast_dev_run_for_each_task_type(task, tiny_model_dir, tmp_path):
    if task == "summarisation":
        data = write_summaries(tmp_path / "news.csv")
        data_args = ["--data.task", "cnn_dailymail", "--data.data_files",
                     f"{{train: {data}, validation: {data}}}"]
    elif task == "text":
        text = tmp_path / "corpus.txt"
        text.write_text("\n".join(f"Line {i} of a small corpus about the weather in town." for i in range(200)))
        data_args = ["--data.task", "text", "--data.block_size", "32",
                     "--data.data_files", f"{{train: {text}, validation: {text}}}"]
    else:
        data_args = ["--data.task", "builtin", "--data.max_train_samples", "16"]
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", *data_args,
                                   "--model.lora", "{r: 4, lora_alpha: 8}", "--trainer.fast_dev_run", "2")])
    assert cli.trainer.state.finished
    assert cli.trainer.global_step == 2
    logged = cli.trainer.logged_metrics
    assert torch.isfinite(logged["val/loss_skip"]) and torch.isfinite(logged["val/loss_dense"])
    if task == "builtin":
        assert "val/bleu" in logged
    if task == "summarisation":
        assert {"val/rouge1", "val/rouge2", "val/rougeL"} <= set(logged)


@pytest.mark.parametrize("family", ["opt", "gpt2"])
def test_full_fine_tuning_of_other_families(family, tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir(family), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "8", "--trainer.fast_dev_run", "1")])
    assert cli.trainer.state.finished and cli.trainer.global_step == 1


@pytest.mark.parametrize(("bound", "label"), [(("--trainer.max_steps", "1"), "Epoch 0"),
                                             (("--trainer.max_epochs", "1"), "Epoch 0/0")], ids=["steps", "epochs"])
def test_the_progress_bar_counts_epochs_only_when_they_bound_the_run(bound, label, tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "4", "--model.generation.num_batches", "0",
                                   "--trainer.limit_val_batches", "1", *bound)])
    bar = cli.trainer.progress_bar_callback
    assert isinstance(bar, ProgressBar) and bar._get_train_description(0).strip() == label  # not "Epoch 0/-2"


def test_validate_from_checkpoint_and_resume_continues_identically(tiny_model_dir, tmp_path):
    common = ["--data.task", "builtin", "--data.max_train_samples", "8",
              "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}",
              "--model.generation.num_batches", "0", "--trainer.log_every_n_steps", "1", "--seed_everything", "3"]
    model_dir = tiny_model_dir("llama")
    # uninterrupted: two epochs of two steps
    main(["fit", *tiny_args(model_dir, tmp_path / "full", *common, "--trainer.max_epochs", "2")])
    # the same run crashing when its second epoch starts, then resumed from the first epoch's checkpoint
    crash = '{"class_path": "helpers.interrupt.CrashAtEpoch", "init_args": {"epoch": 1}}'
    with pytest.raises(SimulatedCrash):
        main(["fit", *tiny_args(model_dir, tmp_path / "part", *common, "--trainer.max_epochs", "2"),
              f"--trainer.callbacks+={crash}"])
    (checkpoint,) = [str(p) for p in (tmp_path / "part").rglob("*.ckpt")]
    main(["fit", *tiny_args(model_dir, tmp_path / "resumed", *common, "--trainer.max_epochs", "2"),
          "--ckpt_path", checkpoint])

    def losses(run: str) -> dict[int, float]:
        return {int(r["step"]): float(r["train/loss"]) for r in read_metrics(tmp_path / run) if r["train/loss"]}

    full, part, resumed = losses("full"), losses("part"), losses("resumed")
    assert len(full) == 4 and set(part) | set(resumed) == set(full)
    for step, value in {**part, **resumed}.items():
        assert value == pytest.approx(full[step], abs=1e-6), f"step {step}"

    restored = SkipLM.load_from_checkpoint(checkpoint)  # outside the CLI too: configured from its hparams
    assert restored.schedule.family == "skipdecode" and restored.model is not None

    validated = main(["validate", *tiny_args(model_dir, tmp_path / "val", *common), "--ckpt_path", checkpoint])
    assert torch.isfinite(validated.trainer.callback_metrics["val/loss_skip"])


def test_distillation_bf16_and_activation_checkpointing(tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "8", "--model.lora", "{r: 4, lora_alpha: 8}",
                                   "--model.distillation", "{weight: 0.5, temperature: 2.0}",
                                   "--model.activation_checkpointing", "true", "--trainer.precision", "bf16-mixed",
                                   "--model.generation.num_batches", "0", "--trainer.fast_dev_run", "2")])
    assert cli.trainer.global_step == 2
    logged = cli.trainer.logged_metrics
    assert logged["train/kl"] > 0, "the skip-aware student differs from its dense teacher"
    assert logged["train/loss"] > logged["train/ce"]
    base = cli.model.model.get_base_model()
    assert activation_checkpointing_on(base)


def test_base_teacher_without_lora_is_refused(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit, match="2"):
        main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                 "--model.distillation", "{weight: 1.0, teacher: base}",
                                 "--trainer.fast_dev_run", "1")])
    assert "teacher='base' needs lora" in capsys.readouterr().err


def write_task_files(task: str, folder: Path) -> str:
    """A tiny local stand-in for a task's hub dataset, in that dataset's own column names."""
    folder.mkdir(parents=True, exist_ok=True)
    pairs = [(f"The council of town {i} met on Monday and agreed a new budget for roads.", f"Town {i} agreed a budget.")
             for i in range(6)]
    if task == "cnn_dailymail":
        return str(write_summaries(folder / "news.csv"))
    columns = {"e2e_nlg": ("meaning_representation", "human_reference"), "xsum": ("document", "summary"),
               "reddit_tldr": ("prompt", "completion")}[task]
    path = folder / f"{task}.jsonl"
    path.write_text("".join(json.dumps(dict(zip(columns, pair, strict=True))) + "\n" for pair in pairs))
    return str(path)


PAPER_RECIPES = sorted(p for p in (ROOT / "recipes").glob("*.yaml") if p.name != "quickstart.yaml")


@pytest.mark.parametrize("recipe", PAPER_RECIPES, ids=lambda p: p.stem)
def test_paper_recipes_run_with_a_tiny_stand_in(recipe, tiny_model_dir, tmp_path):
    """Each recipe as written (schedule, optimiser, precision, checkpointing), with a tiny model of the same
    family and layer count and a tiny local copy of its task's data: one training and one validation step."""
    config = yaml.safe_load(recipe.read_text())
    family = "opt" if "opt" in config["model"]["model"] else "llama"
    num_layers = {"facebook/opt-1.3b": 24, "facebook/opt-6.7b": 32, "meta-llama/Llama-3.2-1B": 16,
                  "smollm2-135m-instruct": 30}[
        config["model"]["model"]]
    data = write_task_files(config["data"]["task"], tmp_path / "data")
    cli = main(["fit", "--config", str(recipe),
                "--model.model", tiny_model_dir(family, num_layers),
                "--data.data_files", f"{{train: {data}, validation: {data}}}",
                "--data.batch_size", "2", "--data.eval_batch_size", "2", "--data.max_source_tokens", "48",
                "--model.generation.max_new_tokens", "4", "--model.generation.num_batches", "1",
                "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.fast_dev_run", "1",
                "--trainer.default_root_dir", str(tmp_path / "run"),
                "--trainer.logger.init_args.save_dir", str(tmp_path / "run")])
    assert cli.trainer.global_step == 1
    assert cli.model.schedule.params["max_layers"] == config["model"]["schedule"]["init_args"]["max_layers"]
    assert torch.isfinite(cli.trainer.callback_metrics["val/loss_skip"])


QUALITY = ROOT / "benchmarks" / "quality"


def study_row(study: str, configuration: str, run: Path):
    """What ``bash benchmarks/quality/study.sh STUDY SCHEDULE LEVER ...`` trains for the row named
    ``SCHEDULE+LEVER+...``: the study's base, the schedule and each lever, with study.sh's substitutions in the levers
    (``runs/STUDY/``: this study's runs; ``RUN/``: the run's folder)."""
    base, schedule, *levers = row_configs(study, configuration)
    configs = ["--config", str(ROOT / base), "--config", str(ROOT / schedule)]
    run.mkdir(parents=True, exist_ok=True)
    for lever in map(Path, levers):
        text = (ROOT / lever).read_text()
        (run / lever.name).write_text(text.replace("runs/STUDY/", f"runs/{study}/").replace("RUN/", f"{run}/"))
        configs += ["--config", str(run / lever.name)]
    return _parse(configs)


def training(cli) -> dict:
    """What a fit trains: the module's settings but generation (evaluation only), with the dtype its weights load in
    (``auto`` resolved under the trainer's precision), the data module's, the trainer's length, accumulation, clipping
    and precision, and the seed."""
    model = {k: v for k, v in cli.model.hparams.items() if k != "generation"}
    model["dtype"] = weights_dtype(cli.trainer.precision, trains_all_weights=cli.model.lora is None,
                                   override=model["dtype"])
    trainer = {k: getattr(cli.trainer, k) for k in ("max_epochs", "max_steps", "accumulate_grad_batches",
                                                      "gradient_clip_val", "precision")}
    return {"model": model, "data": dict(cli.datamodule.hparams), "trainer": trainer,
            "seed": cli.config["seed_everything"]}


@pytest.mark.parametrize("lever", sorted(path.stem for path in (QUALITY / "levers").glob("*.yaml")))
def test_every_study_lever_parses_on_a_study_base(lever, tmp_path, monkeypatch, capsys):
    """A queued row fails hours into a lane if its lever does not parse: each one parses as study.sh stacks it, and
    one that starts from another run (study.sh trains it first) is refused only for that run's missing checkpoint."""
    monkeypatch.chdir(ROOT)
    if "quantization:" in (QUALITY / "levers" / f"{lever}.yaml").read_text() and find_spec("bitsandbytes") is None:
        pytest.skip(f"{lever}.yaml quantizes with bitsandbytes, the optional extra: pip install 'skiptrain[qlora]'")
    study = "e2e" if lever.startswith(("train", "sample")) else "cnndm"  # the E2E data levers name E2E files
    needed = [path.replace("runs/STUDY/", f"runs/{study}/") for path in
              re.findall(r"runs/STUDY/[^/ ]+/last\.ckpt", (QUALITY / "levers" / f"{lever}.yaml").read_text())]
    if all(Path(path).exists() for path in needed):  # where this checkout has trained them, they load
        assert study_row(study, f"flat2x+{lever}", tmp_path / "run").model.schedule_family is not None
        return
    with pytest.raises(SystemExit):
        study_row(study, f"flat2x+{lever}", tmp_path / "run")
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 1 and any(f"'{path}' is invalid" in error[0] for path in needed)


@pytest.mark.parametrize(("fragments", "schedule", "pairs", "levers"), [
    ([], "flat2x", 4000, []),
    (["smollm2-135m_e2e_2x.yaml"], "flat2x", 4000, []),
    (["smollm2-135m_e2e_3x.yaml"], "flat3x", 4000, []),
    (["smollm2-135m_e2e_2k.yaml"], "flat2x", 2000, []),
    (["smollm2-135m_e2e_2k.yaml", "smollm2-135m_e2e_3x.yaml"], "flat3x", 2000, []),
    (["smollm2-135m_e2e_8k.yaml"], "flat2x", 8000, []),
    (["smollm2-135m_e2e_8k.yaml", "smollm2-135m_e2e_3x.yaml"], "flat3x", 8000, []),
    (["smollm2-135m_e2e_2k.yaml", "smollm2-135m_e2e_lossless.yaml"], "flat2x", 2000, ["joint"]),
])
def test_the_smollm2_recipe_trains_exactly_what_the_study_measured(fragments, schedule, pairs, levers, tmp_path,
                                                                   monkeypatch):
    """The user recipe (a seeded subset of the hub's training pairs), read from the study's local files, resolves to
    the study row's training: the same configuration, on a subset of the same size. The lossless fragment is the
    study's joint-objective row, whose acceptance and exactness RESULTS reports."""
    monkeypatch.chdir(ROOT)  # study.env and its paths are the repository root's
    size = [] if pairs == 2000 else [f"train{pairs // 1000}k"]  # the study base trains 2,000 pairs; a lever names more
    study = study_row("e2e", "+".join([schedule, "lora_all_r64", *size, *levers]), tmp_path / "run")
    size_levers = ["--config", str(tmp_path / "run" / f"{size[0]}.yaml")] if size else []
    recipe = _parse(["--config", str(ROOT / "recipes/smollm2-135m_e2e.yaml"),
                     "--config", str(QUALITY / "e2e" / "local_data.yaml"), *size_levers,
                     *[arg for name in fragments for arg in ("--config", str(ROOT / "recipes/fragments" / name))]])

    recipe_training, study_training = training(recipe), training(study)
    # the study trains all of a file of exactly `pairs` pairs, the recipe draws that many from the hub's 42,061
    assert recipe_training["data"].pop("max_train_samples") == pairs
    assert study_training["data"].pop("max_train_samples") is None
    assert Path(study_training["data"]["data_files"]["train"]).name == f"trainset_{pairs}.csv"
    assert recipe_training == study_training


@pytest.mark.parametrize("study", ["cnndm", "xsum"])
def test_the_summarisation_recipes_train_the_headline_configuration(study, tmp_path, monkeypatch):
    """``recipes/smollm2-135m_STUDY.yaml`` trains the skip configuration of the summarisation headline
    (benchmarks/results/summarisation_headline.json): read from the study's own split
    (benchmarks/quality/STUDY/local_data.yaml) it resolves to that row's training, and from the hub it draws as many
    articles as the study's training split holds."""
    monkeypatch.chdir(ROOT)  # study.env and its paths are the repository root's
    names = json.loads((ROOT / "benchmarks/results/summarisation_headline.json").read_text())[study]["skip"]
    configurations = {seedless(Path(name).name.removesuffix(".test.outputs.jsonl")) for name in names}
    assert len(configurations) == 1, f"the headline's seeds train {configurations}"
    study_training = training(study_row(study, configurations.pop(), tmp_path / "run"))
    recipe_training = training(_parse(["--config", str(ROOT / f"recipes/smollm2-135m_{study}.yaml"),
                                       "--config", str(QUALITY / study / "local_data.yaml")]))

    start, end = map(int, re.search(r" train=(\d+):(\d+)", study_env(study)["PREPARE"]).groups())
    assert recipe_training["data"].pop("max_train_samples") == end - start  # all of the study's file, in its order
    assert study_training["data"].pop("max_train_samples") is None
    for side in (recipe_training, study_training):  # evaluation only: how many validation articles are scored
        side["data"].pop("max_eval_samples")
    assert recipe_training == study_training


LORA_VARIANTS = {
    "all_linear": "{r: 4, lora_alpha: 8, lora_dropout: 0, target_modules: all-linear}",
    "dora": "{r: 4, lora_alpha: 8, lora_dropout: 0, use_dora: true}",
    "rslora": "{r: 4, lora_alpha: 8, lora_dropout: 0, use_rslora: true}",
}


@pytest.mark.parametrize("variant", sorted(LORA_VARIANTS))
def test_peft_lora_variants_train_and_export_to_the_training_forward(variant, tiny_model_dir, tmp_path):
    """peft's own LoraConfig fields reach peft: a step of all-linear, DoRA or rsLoRA adapters trains, and the merged
    export's skip-aware forward equals the training forward."""
    model_dir, export_dir = tiny_model_dir("llama"), tmp_path / "export"
    cli = main(["fit", *tiny_args(
        model_dir, tmp_path / "fit", "--data.task", "builtin", "--data.max_train_samples", "4",
        "--model.lora", LORA_VARIANTS[variant], "--model.optimizer.learning_rate", "0.05",
        "--model.generation.num_batches", "0", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "1",
        f"--trainer.callbacks+={EXPORT_CALLBACK % export_dir}")])
    module = cli.model
    config = module.model.peft_config["default"]
    adapted = {name.rsplit(".", 1)[-1] for name, m in module.model.named_modules() if hasattr(m, "lora_A")}
    if variant == "all_linear":  # every linear layer but the LM head: the seven projections the recipes name
        assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    else:
        assert adapted == {"q_proj", "k_proj", "v_proj", "o_proj"}  # the architecture's default
    assert config.use_dora is (variant == "dora") and config.use_rslora is (variant == "rslora")
    if variant == "rslora":
        layer = module.model.base_model.model.model.layers[0].self_attn.q_proj
        assert layer.scaling["default"] == pytest.approx(8 / 4 ** 0.5)

    tokenizer = load_tokenizer(model_dir)
    ids, mask = left_padded(tokenizer, PROMPTS)
    ids, mask = torch.cat([ids, torch.arange(10, 16).repeat(len(PROMPTS), 1)], 1), torch.cat(
        [mask, torch.ones(len(PROMPTS), 6, dtype=mask.dtype)], 1)
    prompt_length = ids.shape[1] - 6
    exported = load_exported(export_dir)
    with torch.no_grad():
        training = skip_forward(module.model.eval(), ids, mask, module.schedule, prompt_length)
        loaded = skip_forward(exported.model, ids, mask, exported.schedule, prompt_length)
        base = skip_forward(load_causal_lm(model_dir).eval(), ids, mask, module.schedule, prompt_length)
    torch.testing.assert_close(loaded, training, atol=1e-5, rtol=0)
    assert not torch.allclose(loaded, base), "the step changed nothing"


def test_generation_metrics_are_on_the_0_100_scale():
    metrics = EvaluationMetrics("both")
    metrics.update_text(["the cat sat on the mat today"], [["the cat sat on the mat today", "a dog"]])
    values = metrics.compute()
    assert values["bleu"] == pytest.approx(100) and values["rougeL"] == pytest.approx(100)
    assert metrics.compute() == {}, "compute resets for the next epoch"
    partial = generation_scores(["the cat sat"], [["the cat sat on the mat today"]], "rouge")
    assert 1 < partial["rouge1"] < 100 and set(partial) == {"rouge1", "rouge2", "rougeL"}
    assert generation_scores(["the cat sat on the mat today"], [["the cat sat on the mat today"]], "bleu") == {
        "bleu": pytest.approx(100)}
