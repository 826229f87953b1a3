"""Projected weight memory of QLoRA bases: bytes of the base model's weights in float32, bfloat16, 8-bit and 4-bit
NF4 (with and without double quantization), from the architecture alone (no weights, no GPU).

    python benchmarks/machine/qlora_weight_memory.py --out benchmarks/results/qlora/weight_memory.json

The models are built on the meta device from their published configs. As transformers' bitsandbytes integration
does, every ``nn.Linear`` inside the decoder is quantized and everything else (embeddings, LM head, norms, biases)
stays in the 16-bit load dtype. Per quantized weight of ``n`` elements, bitsandbytes stores: NF4, ``n / 2`` bytes of
4-bit codes plus one float32 scale per 64-element block; with double quantization those scales become uint8 with one
float32 scale per 256 blocks; 8-bit (LLM.int8()), ``n`` bytes plus a float32 scale per output row. ``--check`` loads
a small model through bitsandbytes and compares the projection with the bytes it really holds.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import torch
from torch import nn
from transformers import AutoModelForCausalLM, LlamaConfig, OPTConfig

BLOCK, NESTED_BLOCK = 64, 256

MODELS = {
    # facebook/opt-6.7b config.json
    "OPT-6.7B": OPTConfig(hidden_size=4096, ffn_dim=16384, num_hidden_layers=32, num_attention_heads=32,
                          vocab_size=50272, max_position_embeddings=2048, word_embed_proj_dim=4096),
    # meta-llama/Meta-Llama-3-8B config.json
    "Llama-3-8B": LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                              num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                              max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False),
}


def nf4_bytes(numel: int, double_quant: bool) -> int:
    blocks = math.ceil(numel / BLOCK)
    scales = blocks + 4 * math.ceil(blocks / NESTED_BLOCK) if double_quant else 4 * blocks
    return math.ceil(numel / 2) + scales


def int8_bytes(weight: torch.Tensor) -> int:
    return weight.numel() + 4 * weight.shape[0]


def projection(model: nn.Module) -> dict[str, float]:
    """Weight bytes of ``model`` (on any device, meta included) under each storage, with its parameter counts."""
    decoder = model.get_decoder()
    quantized = {id(m.weight): m.weight for m in decoder.modules() if isinstance(m, nn.Linear)}
    others = [p for p in {id(p): p for p in model.parameters()}.values() if id(p) not in quantized]
    other_numel = sum(p.numel() for p in others)
    linear_numel = sum(w.numel() for w in quantized.values())
    return {
        "parameters": linear_numel + other_numel,
        "quantized_linear_parameters": linear_numel,
        "float32": 4 * (linear_numel + other_numel),
        "bfloat16": 2 * (linear_numel + other_numel),
        "int8": sum(int8_bytes(w) for w in quantized.values()) + 2 * other_numel,
        "nf4": sum(nf4_bytes(w.numel(), False) for w in quantized.values()) + 2 * other_numel,
        "nf4_double_quant": sum(nf4_bytes(w.numel(), True) for w in quantized.values()) + 2 * other_numel,
    }


def check(width: int = 256) -> dict[str, int]:
    """The projection against what bitsandbytes really stores, for a random 4-layer Llama of ``width``."""
    from transformers import BitsAndBytesConfig

    config = LlamaConfig(hidden_size=width, intermediate_size=4 * width, num_hidden_layers=4, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=1000)
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    quantized = type(plain).from_pretrained(
        None, config=config, state_dict=plain.state_dict(), dtype=torch.bfloat16,
        quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_use_double_quant=True),
    )
    # codes and unquantized tensors are parameters; each quantized weight's scales live in its quant_state
    held = sum(p.numel() * p.element_size() for p in quantized.parameters())
    for module in quantized.modules():
        state = getattr(getattr(module, "weight", None), "quant_state", None)
        if state is not None:
            held += state.absmax.numel() * state.absmax.element_size()
            held += state.state2.absmax.numel() * state.state2.absmax.element_size()
    return {"projected_nf4_double_quant": projection(plain)["nf4_double_quant"], "bitsandbytes_holds": held}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare with a model bitsandbytes really quantizes")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    table = {}
    for name, config in MODELS.items():
        with torch.device("meta"):
            table[name] = projection(AutoModelForCausalLM.from_config(config))
        row = table[name]
        print(f"{name}: {row['parameters'] / 1e9:.2f}B parameters; "
              + ", ".join(f"{k} {row[k] / 2**30:.2f} GiB" for k in
                          ("float32", "bfloat16", "int8", "nf4", "nf4_double_quant")))
    report = {"command": "python benchmarks/machine/qlora_weight_memory.py" + (" --check" if args.check else ""),
              "note": "projected from the architecture (bytes; GiB = 2**30 bytes); weights only: no adapters, "
                      "optimizer state, gradients or activations",
              "models": table}
    if args.check:
        report["check"] = check()
        print("check:", report["check"])
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
