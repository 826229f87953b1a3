"""Tiny random Hugging Face causal LMs of every supported architecture, built from configs (no network)."""

from __future__ import annotations

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma2Config,
    Gemma3TextConfig,
    GPT2Config,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    Phi3Config,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

from skiptrain.modeling.architectures import attention_for

# "mistral-sliding" is Mistral with a sliding window of 4 columns, shorter than every test sequence, so that the
# sliding-window attention masks are built and used (the other Mistral has none).
ARCHITECTURES = ("opt", "llama", "gpt2", "mistral", "mistral-sliding", "qwen2", "qwen3", "gemma2", "gemma3_text",
                 "phi3")
SLIDING_WINDOW = 4


def tiny_config(model_type: str, num_layers: int = 6, vocab_size: int = 97, width: int = 32) -> PretrainedConfig:
    """A config of the given architecture (see :data:`ARCHITECTURES`) with ``num_layers`` layers of width ``width``
    (MLPs twice as wide)."""
    common = {"vocab_size": vocab_size, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    llama_like = dict(hidden_size=width, intermediate_size=2 * width, num_hidden_layers=num_layers,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, **common)
    configs = {
        "opt": lambda: OPTConfig(hidden_size=width, ffn_dim=2 * width, num_hidden_layers=num_layers,
                                 num_attention_heads=4, max_position_embeddings=256, word_embed_proj_dim=width,
                                 **common),
        "llama": lambda: LlamaConfig(**llama_like),
        "mistral": lambda: MistralConfig(sliding_window=None, **llama_like),
        "mistral-sliding": lambda: MistralConfig(sliding_window=SLIDING_WINDOW, **llama_like),
        "qwen2": lambda: Qwen2Config(**llama_like),
        "qwen3": lambda: Qwen3Config(head_dim=width // 4, **llama_like),
        # alternating sliding (window 5, shorter than the tests' sequences) and global layers, both soft-cappings
        "gemma2": lambda: Gemma2Config(head_dim=width // 4, sliding_window=5, final_logit_softcapping=3.0,
                                       attn_logit_softcapping=5.0, **llama_like),
        # two sliding layers (window 5) to one global layer, so that the schedules skip a first global layer (2);
        # local and global rotary base frequencies differ (10^4 and 10^6, the defaults)
        "gemma3_text": lambda: Gemma3TextConfig(
            head_dim=width // 4, sliding_window=5, **llama_like,
            layer_types=["full_attention" if i % 3 == 2 else "sliding_attention" for i in range(num_layers)]),
        "phi3": lambda: Phi3Config(**llama_like),
        "gpt2": lambda: GPT2Config(n_embd=width, n_layer=num_layers, n_head=4, n_positions=256, **common),
    }
    return configs[model_type]()


def tiny_model(model_type: str, num_layers: int = 6, attn: str = "sdpa", seed: int = 0, **kwargs) -> PreTrainedModel:
    """A tiny random model in eval mode, deterministic for a given seed."""
    torch.manual_seed(seed)
    config = tiny_config(model_type, num_layers, **kwargs)
    return AutoModelForCausalLM.from_config(config, attn_implementation=attention_for(model_type, attn)).eval()


def left_padded_batch(
    batch: int, prompt_length: int, continuation: int, vocab_size: int = 97, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random ids ``[B, P + G]`` whose rows have different prompt lengths, all ending at column ``P``."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab_size, (batch, prompt_length + continuation), generator=generator)
    mask = torch.ones_like(ids)
    for row in range(batch):
        mask[row, : (row * 2) % prompt_length] = 0  # rows 0, 1, 2, ... get 0, 2, 4, ... pad columns
    ids = ids.masked_fill(mask == 0, 0)
    return ids, mask
