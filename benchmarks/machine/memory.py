"""Peak memory of LoRA training with weights loaded in fp32 against bf16 (``model.dtype``), one process per case.

Cases: the quickstart's model (SmolLM2-135M-Instruct from its GGUF file, LoRA r=16 on the attention projections) and
a random model of Llama-3.2-1B's shape (16 layers, hidden 2048, vocab 128256, tied embeddings), the same LoRA. Each
case loads the model through skiptrain (the quickstart through
:meth:`~skiptrain.training.module.SkipLM.configure_model`, which reads ``model.dtype``), then runs training steps
(skip-aware forward, cross entropy, backward, AdamW) under bf16 autocast, as ``bf16-mixed`` does. Reported: the bytes
of the weights, the process's resident memory after loading, and its peak resident memory (``VmHWM``) over loading
and training.

    python benchmarks/machine/memory.py --out benchmarks/results/memory_cpu.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

CASES = [("quickstart", "float32"), ("quickstart", "bfloat16"), ("llama1b", "float32"), ("llama1b", "bfloat16")]
SCHEDULE = {"quickstart": (22, 6, 24), "llama1b": (12, 4, 24)}  # SkipDecode max_layers, min_layers, decay_tokens


def resident_mib() -> dict[str, float]:
    """The process's resident memory now (``VmRSS``) and at its peak so far (``VmHWM``), in MiB."""
    status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return {key: int(status[key].split()[0]) / 1024 for key in ("VmRSS", "VmHWM")}


def run_case(model: str, dtype: str, steps: int, batch_size: int, length: int) -> dict:
    """One case, in this process."""
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM, LlamaConfig

    from skiptrain.core.schedules import SkipDecode
    from skiptrain.modeling.architectures import architecture
    from skiptrain.training.losses import target_cross_entropy
    from skiptrain.training.module import SkipLM

    max_layers, min_layers, decay = SCHEDULE[model]
    schedule = SkipDecode(max_layers=max_layers, min_layers=min_layers, decay_tokens=decay)
    started = time.perf_counter()
    if model == "quickstart":
        module = SkipLM("smollm2-135m-instruct", schedule, lora={"r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
                        dtype=dtype)
        module.configure_model()
    else:
        config = LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048,
                             tie_word_embeddings=True, rope_theta=500000.0)
        torch.manual_seed(0)
        base = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=getattr(torch, dtype))
        module = SkipLM("random-llama-1b", schedule, lora={"r": 16, "lora_alpha": 32, "lora_dropout": 0.0},
                        dtype=dtype)
        targets = list(architecture("llama").lora_targets)  # what configure_model gives the quickstart
        lora = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules=targets, task_type="CAUSAL_LM")
        module.model = get_peft_model(base.train(), lora)
        module.schedule = schedule.build(config.num_hidden_layers)
    load_s = time.perf_counter() - started
    assert isinstance(module.model, PeftModel)
    parameters = list(module.model.parameters())
    weights = {
        "frozen_mib": sum(p.numel() * p.element_size() for p in parameters if not p.requires_grad) / 2**20,
        "trainable_mib": sum(p.numel() * p.element_size() for p in parameters if p.requires_grad) / 2**20,
        "frozen_dtype": str(next(p.dtype for p in parameters if not p.requires_grad)),
        "trainable_dtype": str(next(p.dtype for p in parameters if p.requires_grad)),
    }
    after_load = resident_mib()
    torch.manual_seed(0)
    vocab = module.model.config.vocab_size
    prompt = length // 2
    input_ids = torch.randint(0, vocab, (batch_size, length))
    labels = input_ids.clone()
    labels[:, :prompt] = -100
    batch = {"input_ids": input_ids, "attention_mask": torch.ones_like(input_ids), "labels": labels,
             "prompt_length": prompt}
    optimizer = torch.optim.AdamW([p for p in parameters if p.requires_grad], lr=1e-4)
    losses, step_s = [], []
    for _ in range(steps):
        tick = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = target_cross_entropy(*module.target_logits(batch, module.schedule))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss))
        step_s.append(time.perf_counter() - tick)
    return {"model": model, "dtype": dtype, "load_s": round(load_s, 1), "weights": weights,
            "rss_after_load_mib": round(after_load["VmRSS"], 1), "peak_rss_mib": round(resident_mib()["VmHWM"], 1),
            "train_steps": steps, "batch": [batch_size, length], "step_s": [round(s, 2) for s in step_s],
            "losses": [round(v, 4) for v in losses]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="JSON file to write (all cases)")
    parser.add_argument("--case", help="MODEL:DTYPE: run this one case here and print its JSON")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=2)
    parser.add_argument("--length", type=int, default=64, help="tokens per sequence (half prompt, half target)")
    args = parser.parse_args()
    if args.case:
        model, dtype = args.case.split(":")
        print(json.dumps(run_case(model, dtype, args.steps, args.batch_size, args.length)))
        return
    import torch

    results = []
    for model, dtype in CASES:
        command = [sys.executable, __file__, "--case", f"{model}:{dtype}", "--steps", str(args.steps),
                   "--batch_size", str(args.batch_size), "--length", str(args.length)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(json.dumps(results[-1]), flush=True)
    record = {"command": "python benchmarks/machine/memory.py " + " ".join(sys.argv[1:]),
              "torch": torch.__version__, "threads": torch.get_num_threads(), "cases": results}
    if args.out:
        Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
