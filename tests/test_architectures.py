"""Qwen3, Gemma 2 and Phi-3 through the architecture table: Gemma 2's final logits are soft-capped and its attention
is eager, Phi-3's LoRA targets its fused projection, and mixture-of-experts models are refused by name. (Parity with
KV-cached decoding and with transformers: tests/test_forward.py; the per-step work oracle: tests/test_generation.py;
the custom generate: tests/test_custom_generate.py; export round trips: tests/test_export.py.)"""

import pytest
from helpers.tiny_models import left_padded_batch, tiny_config, tiny_model
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM

from skiptrain import SkipDecode, skip_forward
from skiptrain.errors import ModelError, UsageError
from skiptrain.modeling.architectures import architecture, decoder_parts


def test_gemma2_soft_caps_final_logits_and_runs_eager():
    model = tiny_model("gemma2", 4, attn="sdpa")  # sdpa cannot soft-cap attention logits: eager is chosen
    assert model.config._attn_implementation == "eager"
    ids, mask = left_padded_batch(batch=2, prompt_length=5, continuation=3)
    logits = skip_forward(model, ids, mask, SkipDecode(min_layers=2).build(4), 5)
    cap = model.config.final_logit_softcapping
    assert logits.abs().max() < cap
    sdpa = AutoModelForCausalLM.from_config(tiny_config("llama", 2), attn_implementation="sdpa")
    sdpa.config.model_type = "gemma2"  # a Gemma 2 config forced onto sdpa is refused by name
    with pytest.raises(UsageError, match=r"attn_implementation='sdpa' .* model_type='gemma2': allowed \['eager'\]"):
        decoder_parts(sdpa)


def test_phi3_lora_targets_its_fused_projection():
    targets = list(architecture("phi3").lora_targets)
    model = get_peft_model(tiny_model("phi3", 4), LoraConfig(r=2, target_modules=targets))
    adapted = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert adapted == {"qkv_proj", "o_proj"}
    ids, mask = left_padded_batch(batch=2, prompt_length=4, continuation=2)
    skip_forward(model, ids, mask, SkipDecode(min_layers=2).build(4), 4).sum().backward()
    assert all(p.grad is not None for n, p in model.named_parameters() if "lora_" in n)


@pytest.mark.parametrize("model_type", ["mixtral", "qwen3_moe"])
def test_mixture_of_experts_is_refused_by_name(model_type):
    with pytest.raises(ModelError, match=f"model_type='{model_type}' is a mixture-of-experts model"):
        architecture(model_type)

