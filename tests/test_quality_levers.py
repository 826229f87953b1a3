"""The levers of skip-aware training: losses, distillation teachers, the curriculum, two-stage initialisation."""

import random

import pytest
import torch
from helpers.callbacks import RecordSchedules
from helpers.cli_args import tiny_args
from helpers.schedules import random_family

from skiptrain.cli.app import main
from skiptrain.core.curriculum import anneal_from_dense
from skiptrain.core.schedules import Dense, SkipDecode
from skiptrain.modeling.loading import load_causal_lm
from skiptrain.text.batch import collate
from skiptrain.training.checkpoints import CheckpointError
from skiptrain.training.losses import distillation_kl, hidden_state_mse, target_cross_entropy
from skiptrain.training.module import Curriculum, Distillation, SkipLM
from skiptrain.training.sources import load_trained_model, resolve_weights_source


# -- losses --------------------------------------------------------------------------------------------------------
def test_distillation_kl_is_the_categorical_kl_scaled_by_t_squared():
    generator = torch.Generator().manual_seed(0)
    student, teacher = torch.randn(5, 11, generator=generator), torch.randn(5, 11, generator=generator)
    for t in (1.0, 2.0, 0.5):
        reference = torch.distributions.kl_divergence(
            torch.distributions.Categorical(logits=teacher / t), torch.distributions.Categorical(logits=student / t)
        ).mean() * t**2
        assert distillation_kl(student, teacher, t) == pytest.approx(float(reference), rel=1e-5)
    assert float(distillation_kl(teacher, teacher)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="temperature=0"):
        distillation_kl(student, teacher, 0)


def test_distillation_kl_sends_no_gradient_to_the_teacher():
    student, teacher = torch.randn(3, 7, requires_grad=True), torch.randn(3, 7, requires_grad=True)
    distillation_kl(student, teacher, 2.0).backward()
    assert student.grad is not None and student.grad.abs().sum() > 0
    assert teacher.grad is None


def test_hidden_state_mse_is_the_mse_relative_to_the_teachers_mean_square():
    teacher = torch.randn(5, 8) * 3
    student = (teacher + torch.randn(5, 8)).requires_grad_()
    expected = ((student - teacher) ** 2).mean() / (teacher**2).mean()
    assert float(hidden_state_mse(student, teacher)) == pytest.approx(float(expected), rel=1e-6)
    assert float(hidden_state_mse(teacher, teacher)) == 0.0
    assert float(hidden_state_mse(torch.zeros(5, 8), teacher)) == pytest.approx(1.0)
    teacher.requires_grad_()
    hidden_state_mse(student, teacher).backward()
    assert student.grad is not None and teacher.grad is None, "no gradient reaches the teacher"


def test_target_cross_entropy_matches_the_mean_negative_log_likelihood():
    logits, targets = torch.randn(6, 9, dtype=torch.bfloat16), torch.randint(0, 9, (6,))
    nll = -torch.log_softmax(logits.float(), -1)[torch.arange(6), targets].mean()
    assert target_cross_entropy(logits, targets) == pytest.approx(float(nll), rel=1e-6)


# -- curriculum ----------------------------------------------------------------------------------------------------
def test_annealed_schedules_are_nested_and_move_from_dense_to_the_target():
    rng = random.Random(0)
    for _ in range(150):
        num_layers = rng.choice([3, 4, 6, 12, 24, 30])
        target = random_family(rng, num_layers).build(num_layers)
        previous = None
        for progress in (0.0, 0.1, 0.25, 0.5, 0.77, 0.99, 1.0):
            annealed = anneal_from_dense(target, progress)  # SkipSchedule validates nesting when it is built
            length = target.span + 3
            for g in range(length):
                assert set(target.executed_layers(g)) <= set(annealed.executed_layers(g))
                if previous is not None:  # depth never grows as the curriculum advances
                    assert set(annealed.executed_layers(g)) <= set(previous.executed_layers(g))
            assert set(target.prompt_layers) <= set(annealed.prompt_layers)
            previous = annealed
        assert anneal_from_dense(target, 1.0) == target
        start = anneal_from_dense(target, 0.0)
        assert all(len(s) == num_layers for s in start.materialize(target.span + 2)), "progress 0 is dense"


def test_annealed_skipdecode_keeps_a_contiguous_top_block():
    target = SkipDecode(min_layers=9, max_layers=20, decay_tokens=32).build(30)
    for progress in (0.2, 0.5, 0.8):
        for layers in anneal_from_dense(target, progress).materialize(40):
            top = layers[1:]
            assert layers[0] == 0 and list(top) == list(range(top[0], 30)), layers
    halfway = anneal_from_dense(target, 0.5)
    assert len(halfway.executed_layers(0)) == 20 + (30 - 20) // 2
    assert len(halfway.executed_layers(40)) == 9 + (30 - 9) // 2


def test_curriculum_progress_and_validation():
    assert Curriculum(fraction=0.5).progress(0, 100) == 0.0
    assert Curriculum(fraction=0.5).progress(25, 100) == pytest.approx(0.5)
    assert Curriculum(fraction=0.5).progress(80, 100) == 1.0
    with pytest.raises(ValueError, match="curriculum.fraction=0"):
        Curriculum(fraction=0)


def test_fit_with_a_curriculum_anneals_then_trains_validates_and_keeps_the_target(tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir("llama", 6), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "24", "--model.curriculum", "{fraction: 0.5}",
                                   "--model.generation.num_batches", "0", "--trainer.max_steps", "6",
                                   "--trainer.callbacks+=helpers.callbacks.RecordSchedules")])
    (recorder,) = [c for c in cli.trainer.callbacks if isinstance(c, RecordSchedules)]
    target = cli.model.schedule
    assert target == SkipDecode(min_layers=2, decay_tokens=6).build(6), "validation and export use the target"
    depths = [s.mean_layers_per_token(8) for s in recorder.schedules]
    assert len(depths) == 6 and depths[0] == 6.0, "the first step runs every layer"
    assert depths == sorted(depths, reverse=True) and depths[2] > depths[3]
    assert recorder.schedules[3:] == [target] * 3, "the second half trains the target schedule"


# -- distillation teachers -----------------------------------------------------------------------------------------
def tiny_batch(vocab_size: int, pad: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    examples = [{"prompt_ids": torch.randint(3, vocab_size, (n,), generator=generator).tolist(),
                 "target_ids": torch.randint(3, vocab_size, (t,), generator=generator).tolist()}
                for n, t in ((5, 4), (3, 6), (7, 2))]
    return collate(examples, pad_token_id=pad)


def hf_target_logits(model: torch.nn.Module, batch: dict) -> torch.Tensor:
    """Logits of a plain transformers forward at the columns that predict a labelled token."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
    return logits[batch["labels"][:, 1:] != -100].float()


def perturbed_lora_module(model_dir: str, teacher: str) -> SkipLM:
    module = SkipLM(model=model_dir, schedule=SkipDecode(min_layers=2, decay_tokens=3),
                    lora={"r": 2, "lora_alpha": 4, "lora_dropout": 0.3}, distillation=Distillation(teacher=teacher))
    module.configure_model()
    with torch.no_grad():  # non-zero adapters, so the trained weights differ from the base
        for name, parameter in module.model.named_parameters():
            if "lora_B" in name:
                parameter.normal_(0, 0.5)
    return module.train()


def test_dense_teacher_logits_equal_the_dense_forward_of_the_current_weights(tiny_model_dir):
    module = perturbed_lora_module(tiny_model_dir("llama"), "dense")
    batch = tiny_batch(module.model.config.vocab_size, module.get_tokenizer().pad_token_id)
    teacher = module.teacher_targets(batch)[1]
    assert module.model.training, "the teacher pass leaves the model in training mode"
    module.model.eval()
    with torch.no_grad():
        reference = hf_target_logits(module.model, batch)
    torch.testing.assert_close(teacher, reference, atol=1e-4, rtol=1e-4)
    student = module.target_logits(batch, module.schedule)[0]
    assert (student - teacher).abs().max() > 1e-3, "the skipped path differs from its dense teacher"
    teacher_hidden = module.teacher_targets(batch)[0]
    with torch.no_grad():
        torch.testing.assert_close(module.model.get_output_embeddings()(teacher_hidden).float(), teacher)


def test_base_teacher_is_the_model_without_adapters(tiny_model_dir):
    module = perturbed_lora_module(tiny_model_dir("llama"), "base")
    batch = tiny_batch(module.model.config.vocab_size, module.get_tokenizer().pad_token_id)
    base = load_causal_lm(tiny_model_dir("llama")).eval()
    with torch.no_grad():
        torch.testing.assert_close(module.teacher_targets(batch)[1], hf_target_logits(base, batch), atol=1e-4,
                                   rtol=1e-4)


# -- two-stage training ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dense_run(tiny_model_dir, tmp_path_factory):
    """A short dense LoRA fit of the tiny llama: its checkpoint and its export."""
    run = tmp_path_factory.mktemp("dense")
    args = tiny_args(tiny_model_dir("llama"), run / "fit", "--data.task", "builtin", "--data.max_train_samples", "8",
                     "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}",
                     "--model.optimizer.learning_rate", "0.05",
                     "--model.generation.num_batches", "0", "--trainer.max_steps", "2")
    at = args.index("--model.schedule")
    args[at:at + 6] = ["--model.schedule", "Dense"]  # tiny_args' SkipDecode and its two parameters
    main(["fit", *args])
    (checkpoint,) = (run / "fit").rglob("*.ckpt")
    export = run / "export"
    main(["export", "--model.model", tiny_model_dir("llama"), "--model.schedule", "Dense",
          "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}", "--ckpt_path", str(checkpoint),
          "--output_dir", str(export), "--trainer.accelerator", "cpu"])
    return checkpoint, export


def dense_run_weights(checkpoint) -> dict[str, torch.Tensor]:
    """The dense run's weights read independently of training.sources: Lightning's loader, then peft's merge."""
    module = SkipLM.load_from_checkpoint(checkpoint, map_location="cpu")
    return {k: v.clone() for k, v in module.model.merge_and_unload().state_dict().items()}


@pytest.mark.parametrize("source", ["checkpoint", "export"])
def test_two_stage_initialisation_loads_exactly_the_dense_runs_weights(source, dense_run, tiny_model_dir):
    checkpoint, export = dense_run
    expected = dense_run_weights(checkpoint)
    module = SkipLM(model=tiny_model_dir("llama"), schedule=SkipDecode(min_layers=2, decay_tokens=3),
                    lora={"r": 2, "lora_alpha": 4, "lora_dropout": 0},
                    init_from=str(checkpoint if source == "checkpoint" else export))
    module.configure_model()
    loaded = module.model.get_base_model().state_dict()
    base_keys = {k.replace(".base_layer", ""): v for k, v in loaded.items() if "lora_" not in k}
    assert set(base_keys) == set(expected)
    untrained = load_causal_lm(tiny_model_dir("llama")).state_dict()
    for key, value in expected.items():
        assert torch.equal(base_keys[key], value), key
    assert any(not torch.equal(v, untrained[k]) for k, v in expected.items()), "the dense run changed the weights"
    assert any(p.requires_grad for n, p in module.model.named_parameters() if "lora_" in n), "fresh adapters train"


def test_a_run_of_another_architecture_is_refused(dense_run, tiny_model_dir):
    checkpoint, _ = dense_run
    module = SkipLM(model=tiny_model_dir("llama", 6), schedule=Dense(), init_from=str(checkpoint))
    with pytest.raises(CheckpointError, match="does not fit the model"):
        module.configure_model()


def test_teacher_from_a_run_is_frozen_and_outside_the_state_dict(dense_run, tiny_model_dir):
    checkpoint, _ = dense_run
    module = SkipLM(model=tiny_model_dir("llama"), schedule=SkipDecode(min_layers=2, decay_tokens=3),
                    lora={"r": 2, "lora_alpha": 4}, distillation=Distillation(teacher=str(checkpoint)))
    module.configure_model()
    assert not any(k.startswith("_teacher") for k in module.state_dict())
    assert all(not p.requires_grad for p in module._teacher[0].parameters())
    batch = tiny_batch(module.model.config.vocab_size, module.get_tokenizer().pad_token_id)
    reference = load_trained_model(resolve_weights_source(checkpoint)).eval()
    with torch.no_grad():
        torch.testing.assert_close(module.teacher_targets(batch)[1], hf_target_logits(reference, batch), atol=1e-4,
                                   rtol=1e-4)


def test_bad_lever_values_name_the_field(tmp_path):
    with pytest.raises(ValueError, match="distillation.teacher='nowhere'"):
        Distillation(teacher="nowhere")
    with pytest.raises(ValueError, match="distillation.hidden_weight=-1 is invalid: allowed >= 0"):
        Distillation(hidden_weight=-1)
    with pytest.raises(ValueError, match="init_from="):
        SkipLM(model="x", schedule=Dense(), init_from=str(tmp_path / "missing.ckpt"))
    with pytest.raises(ValueError, match="dense_loss_weight=-1"):
        SkipLM(model="x", schedule=Dense(), dense_loss_weight=-1)
    with pytest.raises(ValueError, match="schedule='SkipDecode' is invalid"):
        SkipLM(model="x", schedule="SkipDecode")


def test_there_is_no_default_schedule(tiny_model_dir):
    with pytest.raises(ValueError, match="model.schedule is required"):
        SkipLM(model=tiny_model_dir("llama")).configure_model()


def test_joint_objective_adds_the_dense_cross_entropy(tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "8", "--model.dense_loss_weight", "0.5",
                                   "--model.generation.num_batches", "0", "--trainer.fast_dev_run", "1")])
    logged = cli.trainer.logged_metrics
    assert float(logged["train/loss"]) == pytest.approx(
        float(logged["train/ce"]) + 0.5 * float(logged["train/ce_dense"]), rel=1e-5)


def test_hidden_state_distillation_adds_its_weighted_term(tiny_model_dir, tmp_path):
    cli = main(["fit", *tiny_args(tiny_model_dir("llama"), tmp_path / "run", "--data.task", "builtin",
                                   "--data.max_train_samples", "8", "--model.distillation",
                                   "{weight: 0.0, hidden_weight: 2.0, teacher: dense}",
                                   "--model.generation.num_batches", "0", "--trainer.fast_dev_run", "1")])
    logged = cli.trainer.logged_metrics
    assert float(logged["train/hidden_mse"]) > 0, "the skipped path's final states differ from the dense path's"
    assert float(logged["train/loss"]) == pytest.approx(
        float(logged["train/ce"]) + 2.0 * float(logged["train/hidden_mse"]), rel=1e-5)
