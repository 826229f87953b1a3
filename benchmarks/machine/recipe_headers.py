"""The expected-cost lines in the headers of the recipes this project never trained at their size (every recipe but
the SmolLM2 and quickstart ones), written from :mod:`benchmarks.machine.scale_estimate`'s cost model so that a
recipe's header follows the recipe: a test fails when one is stale.

    python -m benchmarks.machine.recipe_headers           # names the stale headers (exit 1 if any)
    python -m benchmarks.machine.recipe_headers --write   # rewrites them

Each recipe is costed as written and, where it fine-tunes every weight, with ``recipes/fragments/lora.yaml``, on the
fewest H100s that hold it: one as written, else 2, 4 or 8 under ``recipes/strategies/deepspeed_zero3.yaml``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from benchmarks.machine.scale_estimate import GPUS, UTILISATION, Cost, Recipe, cost, read_recipe, span

RECIPES = Path("recipes")
GPU, SHARDED = "h100", (2, 4, 8)
ZERO3, LORA = "recipes/strategies/deepspeed_zero3.yaml", "recipes/fragments/lora.yaml"
MARK = "# Not run at this size"


def large_recipes() -> list[Path]:
    return sorted(p for p in RECIPES.glob("*.yaml") if not p.name.startswith(("smollm2", "quickstart")))


def fewest_gpus(configs: list[str], recipe: Recipe) -> Cost | None:
    """The cost of ``recipe`` (``configs`` as parsed) on the fewest H100s that hold the run (``None``: not even 8
    under ZeRO-3)."""
    one = cost(recipe, GPU, 1)
    if one.fits:
        return one
    sharded = read_recipe([*configs, ZERO3])
    return next((c for c in (cost(sharded, GPU, n) for n in SHARDED) if c.fits), None)


def expected_lines(recipe: Path) -> list[str]:
    """The header lines for ``recipe``."""
    label, _, capacity = GPUS[GPU]
    lines = [f"{MARK}: this project trains SmolLM2-135M on CPUs (benchmarks/RESULTS.md). Expected on {label}",
             f"# ({capacity} GB) by benchmarks/machine/scale_estimate.py, at {UTILISATION[0]:.0%}-{UTILISATION[1]:.0%} "
             "of the bf16 peak, memory before allocator slack:"]
    written = read_recipe([str(recipe)])
    variants = [("as written", [str(recipe)], written)]
    if written.lora is None:
        variants.append((f"with {LORA}", [str(recipe), LORA], read_recipe([str(recipe), LORA])))
    for what, configs, parsed in variants:
        c = fewest_gpus(configs, parsed)
        if c is None:
            lines.append(f"#   {what}: more than {SHARDED[-1]} x H100 even under ZeRO-3")
            continue
        where = f"{c.gpus} x H100" + (f" with {ZERO3}" if c.gpus > 1 else "")
        lines.append(f"#   {what}: {where}, {sum(c.memory.values()) / 1e9:.0f} GB a GPU, {span(c.hours)} an epoch, "
                     f"{span(c.run_hours)} in all")
    return lines


def with_expected(text: str, lines: list[str]) -> str:
    """``text`` whose header carries ``lines`` just before its first empty comment line, in place of the block there
    that starts with :data:`MARK`."""
    header = text.splitlines()
    end = header.index("#")
    start = next((i for i, line in enumerate(header[:end]) if line.startswith(MARK)), end)
    return "\n".join([*header[:start], *lines, *header[end:]]) + "\n"


def rewritten(recipe: Path) -> str:
    """``recipe``'s text with its expected-cost lines as they should now read."""
    return with_expected(recipe.read_text(), expected_lines(recipe))


def stale(recipes: list[Path]) -> list[Path]:
    return [r for r in recipes if rewritten(r) != r.read_text()]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the stale headers")
    args = parser.parse_args(argv)
    for name in ("lightning.pytorch", "lightning.fabric", "skiptrain"):
        logging.getLogger(name).setLevel(logging.WARNING)
    found = False
    for recipe in large_recipes():
        text = rewritten(recipe)
        if text != recipe.read_text():
            found = True
            if args.write:
                recipe.write_text(text)
            print(f"{recipe}: {'rewritten' if args.write else 'stale'}")
    if found and not args.write:
        sys.exit(1)


if __name__ == "__main__":
    main()
