"""The lossless-mode bound S = (1 - a^(K+1)) / ((1 - a)(K c + 1)) for SmolLM2-135M and OPT-6.7B from a measured a.

    python benchmarks/speed/lossless_bound.py --measured benchmarks/results/e2e/lossless/base.flat2x.exactness.b8.json \
        --out benchmarks/results/e2e/lossless/bound_projection.json

A decode step at small batch is bound by reading the weights, so a draft step's cost is modelled as the parameters it
reads over a full-depth step's: its decoder layers plus the LM head, which every step reads. The models are built
from their configs on the meta device (no weights). For SmolLM2 the modelled c stands next to the c measured on
this CPU; for OPT-6.7B only the model exists here. The bound is evaluated at the measured acceptance and at the
acceptances a better-trained draft would need.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, LlamaConfig, OPTConfig

from skiptrain.shipped.speculate import speedup_bound

CONFIGS = {  # the published architectures (hidden sizes, layers, vocabularies)
    "SmolLM2-135M": LlamaConfig(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True),
    "OPT-6.7B": OPTConfig(hidden_size=4096, ffn_dim=16384, num_hidden_layers=32, num_attention_heads=32,
                          vocab_size=50272, word_embed_proj_dim=4096),
}
DRAFT_DEPTHS = {"flat2x": 0.5, "flat3x": 1 / 3}


def parameter_counts(config) -> tuple[int, int]:
    """``(one decoder layer, LM head)`` parameters."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    layers = model.get_decoder().layers
    return sum(p.numel() for p in layers[0].parameters()), model.get_output_embeddings().weight.numel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measured", type=Path, nargs="+", required=True, help="lossless.py result files")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    measured = []
    for path in args.measured:
        result = json.loads(path.read_text())
        for row in result["speculative"]:
            measured.append({"file": str(path), "draft": Path(result["draft_schedule"]["file"]).stem, "batch":
                             result["batch"], "K": row["draft_tokens"], "a": row["acceptance"],
                             "c_measured": row["draft_cost_c"], "bound_measured": row["bound"]})
    models = {}
    for name, config in CONFIGS.items():
        layer, head = parameter_counts(config)
        total = layer * config.num_hidden_layers + head
        drafts = {}
        for draft, depth in DRAFT_DEPTHS.items():
            c = (layer * round(config.num_hidden_layers * depth) + head) / total
            drafts[draft] = {
                "c_parameter_read": c,
                "bound_at_measured_a": [{**m, "bound": speedup_bound(m["a"], m["K"], c)} for m in measured
                                        if m["draft"].endswith(draft)],
                "bound_by_a": {f"{a:.2f}": {k: speedup_bound(a, k, c) for k in (2, 4, 6)}
                               for a in (0.5, 0.6, 0.7, 0.8, 0.9)},
            }
        models[name] = {"layer_parameters": layer, "lm_head_parameters": head, "lm_head_share": head / total,
                        "drafts": drafts}
    result = {"command": "python benchmarks/speed/lossless_bound.py " + " ".join(
        f"--{k} {' '.join(map(str, v)) if isinstance(v, list) else v}" for k, v in vars(args).items()),
        "measured": measured, "models": models}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
