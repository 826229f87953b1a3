"""Qwen3, Gemma 2, Gemma 3 and Phi-3 through the architecture table: Gemma 2's final logits are soft-capped and its
attention is eager, Gemma 3's sliding and global layers get their own rotary embeddings, Phi-3's LoRA targets its fused
projection, and mixture-of-experts models are refused by name. (Parity with KV-cached decoding and with transformers:
tests/test_forward.py; the per-step work oracle: tests/test_generation.py; the custom generate:
tests/test_custom_generate.py; export round trips: tests/test_export.py.)"""

import pytest
import torch
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


def test_gemma3_layers_get_the_rotary_embeddings_of_their_kind_under_sdpa():
    model = tiny_model("gemma3_text", 6)
    assert model.config._attn_implementation == "sdpa"  # no attention-logit soft-capping
    parts = decoder_parts(model)
    assert parts.layer_types == ["sliding_attention", "sliding_attention", "full_attention"] * 2
    hidden, positions = torch.zeros(1, 4, 32), torch.arange(4)[None]
    inputs = parts.layer_inputs(hidden, positions)
    local, remote = inputs[0]["position_embeddings"], inputs[2]["position_embeddings"]
    assert inputs[1]["position_embeddings"] is local and inputs[5]["position_embeddings"] is remote
    assert not torch.allclose(local[1], remote[1]), "local (10^4) and global (10^6) base frequencies"
    model.config.use_bidirectional_attention = True  # EmbeddingGemma's setting: not a causal LM
    with pytest.raises(ModelError, match="use_bidirectional_attention=True is not supported"):
        decoder_parts(model)


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

