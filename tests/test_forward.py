"""The skip-aware forward: exact parity with KV-cached decoding, dense == vanilla transformers, gradients."""

import pytest
import torch
from helpers.tiny_models import ARCHITECTURES, SLIDING_WINDOW, left_padded_batch, tiny_model
from peft import LoraConfig, get_peft_model

from skiptrain import (
    Dense,
    Hierarchical,
    Ranked,
    SkipDecode,
    Static,
    generate_under_schedule,
    position_ids_from_mask,
    skip_forward,
)
from skiptrain.modeling.architectures import decoder_parts, enable_activation_checkpointing

NUM_LAYERS = 6
SCHEDULES = {
    "skipdecode": SkipDecode(min_layers=2, max_layers=5, warmup_layers=1, decay_tokens=6),
    "hierarchical": Hierarchical(phase_boundaries=(0, 4)),
    "skipdecode-max-prompt": SkipDecode(min_layers=3, max_layers=4, decay_tokens=3, prompt_depth="max"),
    "ranked": Ranked(min_layers=2, max_layers=5, decay_tokens=5, ranking=(4, 0, 2, 5, 1, 3)),
    "static": Static(layers=(0, 2, 3)),
}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("schedule_name", sorted(SCHEDULES))
@pytest.mark.parametrize("family", ARCHITECTURES)
def test_training_forward_equals_kv_cached_decoding(family, schedule_name, attn):
    model = tiny_model(family, NUM_LAYERS, attn=attn)
    schedule = SCHEDULES[schedule_name].build(NUM_LAYERS)
    prompt_length, steps = 7, 12
    ids, mask = left_padded_batch(batch=3, prompt_length=prompt_length, continuation=0)
    decoded = generate_under_schedule(model, ids, mask, schedule, max_new_tokens=steps, return_logits=True)
    assert decoded.tokens.shape == (3, steps)
    full_ids = torch.cat([ids, decoded.tokens], dim=1)
    full_mask = torch.cat([mask, torch.ones_like(decoded.tokens)], dim=1)
    with torch.no_grad():
        logits = skip_forward(model, full_ids, full_mask, schedule, prompt_length)
    trained_view = logits[:, prompt_length - 1 : prompt_length - 1 + steps]  # logits that predict token g
    assert (trained_view - decoded.logits).abs().max().item() <= 1e-4
    # real skipping: the dense model gives clearly different logits
    with torch.no_grad():
        dense = skip_forward(model, full_ids, full_mask, Dense().build(NUM_LAYERS), prompt_length)
    assert (dense[:, prompt_length:] - logits[:, prompt_length:]).abs().max().item() > 1e-2


def test_the_sliding_window_is_shorter_than_the_sequences_it_masks():
    """The sliding-window Mistral differs from the same weights with full attention exactly from the first column
    whose window excludes a real earlier token, so the parity tests above run its sliding-window masks."""
    sliding = tiny_model("mistral-sliding", NUM_LAYERS)
    full = tiny_model("mistral", NUM_LAYERS)  # the same seed: the same weights
    assert torch.equal(sliding.model.layers[0].self_attn.q_proj.weight, full.model.layers[0].self_attn.q_proj.weight)
    ids, mask = left_padded_batch(batch=1, prompt_length=7, continuation=12)
    schedule = Dense().build(NUM_LAYERS)
    with torch.no_grad():
        windowed, unwindowed = (skip_forward(m, ids, mask, schedule, 7) for m in (sliding, full))
    differs = (windowed - unwindowed).abs().amax(dim=-1)[0] > 1e-5
    assert not differs[:SLIDING_WINDOW].any() and differs[SLIDING_WINDOW:].all()


@pytest.mark.parametrize("family", ARCHITECTURES)
def test_dense_schedule_reproduces_transformers(family):
    model = tiny_model(family, NUM_LAYERS)
    prompt_length = 6
    ids, mask = left_padded_batch(batch=3, prompt_length=prompt_length, continuation=5, seed=1)
    dense = Dense().build(NUM_LAYERS)
    with torch.no_grad():
        expected = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits
        ours = skip_forward(model, ids, mask, dense, prompt_length)
    real = mask.bool()
    assert torch.equal(ours[real], expected[real])

    prompts, prompt_mask = ids[:, :prompt_length], mask[:, :prompt_length]
    reference = model.generate(input_ids=prompts, attention_mask=prompt_mask, do_sample=False, max_new_tokens=10,
                               min_new_tokens=10, pad_token_id=0, eos_token_id=None)
    decoded = generate_under_schedule(model, prompts, prompt_mask, dense, max_new_tokens=10)
    assert torch.equal(decoded.tokens, reference[:, prompt_length:])


@pytest.mark.parametrize("family", ["opt", "llama", "gpt2"])
def test_gradients_reach_exactly_the_executed_layers(family):
    model = tiny_model(family, NUM_LAYERS).train()
    schedule = Static(layers=(0, 2, 5), prompt_depth="max").build(NUM_LAYERS)  # layers 1, 3, 4 never run
    ids, mask = left_padded_batch(batch=3, prompt_length=5, continuation=4)
    skip_forward(model, ids, mask, schedule, prompt_length=5).logsumexp(-1).mean().backward()
    parts = decoder_parts(model)
    for index, layer in enumerate(parts.layers):
        grads = [p.grad for p in layer.parameters()]
        assert all(g is not None for g in grads), "every layer takes part in the graph (DDP, ZeRO-3)"
        total = sum(g.abs().sum().item() for g in grads)
        if index in (0, 2, 5):
            assert total > 0, f"layer {index} runs and must get a gradient"
        else:
            assert total == 0, f"layer {index} is skipped by every column and must get zero gradient"


def test_lora_and_activation_checkpointing_match_plain_forward():
    model = tiny_model("llama", NUM_LAYERS)
    schedule = SCHEDULES["skipdecode"].build(NUM_LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=6, continuation=6)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    lora.train()
    plain = skip_forward(lora, ids, mask, schedule, 6)
    plain.logsumexp(-1).mean().backward()
    plain_grads = {n: p.grad.clone() for n, p in lora.named_parameters() if p.requires_grad}
    assert plain_grads and all(g.abs().sum() > 0 for g in plain_grads.values()), "adapter gradients are non-zero"
    lora.zero_grad()
    enable_activation_checkpointing(lora.base_model.model)
    checkpointed = skip_forward(lora, ids, mask, schedule, 6)
    checkpointed.logsumexp(-1).mean().backward()
    assert torch.allclose(checkpointed, plain)
    for name, param in lora.named_parameters():
        if param.requires_grad:
            assert torch.allclose(param.grad, plain_grads[name], atol=1e-6), name


def test_skipped_columns_really_skip_work():
    """Each layer is applied to exactly the prefix of columns that runs it, and never to more."""
    model = tiny_model("llama", NUM_LAYERS)
    schedule = SkipDecode(min_layers=2, max_layers=6, decay_tokens=4).build(NUM_LAYERS)
    seen = []
    hooks = [layer.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[1]))
             for layer in decoder_parts(model).layers]
    ids, mask = left_padded_batch(batch=2, prompt_length=5, continuation=8)
    with torch.no_grad():
        skip_forward(model, ids, mask, schedule, prompt_length=5)
    for hook in hooks:
        hook.remove()
    assert seen == schedule.layer_run_lengths(5, 13)
    assert seen == [13, 6, 7, 8, 9, 13]


def test_refusals():
    model = tiny_model("llama", NUM_LAYERS)
    ids, mask = left_padded_batch(batch=3, prompt_length=6, continuation=2)
    with pytest.raises(ValueError, match="num_layers=4 of the schedule does not match the model's 6"):
        skip_forward(model, ids, mask, Dense().build(4), 6)
    with pytest.raises(ValueError, match="prompts must be left-padded"):
        skip_forward(model, ids, mask.flip(1), Dense().build(NUM_LAYERS), 6)
    with pytest.raises(ValueError, match="prompt_length=20 is invalid"):
        skip_forward(model, ids, mask, Dense().build(NUM_LAYERS), 20)
    flash = tiny_model("llama", NUM_LAYERS)
    flash.config._attn_implementation = "flex_attention"
    with pytest.raises(ValueError, match="attn_implementation='flex_attention' is not supported.*'eager', 'sdpa'"):
        skip_forward(flash, ids, mask, Dense().build(NUM_LAYERS), 6)
    bert_like = tiny_model("llama", NUM_LAYERS)
    bert_like.config.model_type = "falcon"
    with pytest.raises(ValueError, match="model_type='falcon' is not supported.*allowed \\['gemma2', 'gemma3_text'"):
        skip_forward(bert_like, ids, mask, Dense().build(NUM_LAYERS), 6)
    opt = tiny_model("opt", NUM_LAYERS).train()
    opt.config.layerdrop = 0.1
    with pytest.raises(ValueError, match="layerdrop=0.1 is not supported"):
        skip_forward(opt, ids, mask, Dense().build(NUM_LAYERS), 6)


def test_state_dict_keys_stay_those_of_transformers():
    model = tiny_model("opt", NUM_LAYERS)
    keys = set(model.state_dict())
    ids, mask = left_padded_batch(batch=2, prompt_length=4, continuation=3)
    skip_forward(model, ids, mask, SCHEDULES["skipdecode"].build(NUM_LAYERS), 4)
    assert set(model.state_dict()) == keys
    assert type(model).__module__.startswith("transformers.")
