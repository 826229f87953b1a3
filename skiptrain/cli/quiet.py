"""A quiet start: silence the third-party messages a skiptrain run cannot act on, each by its text and origin.

Only these are dropped, so any other warning or log line still shows:

- torch's deprecation of ``isinstance(treespec, LeafSpec)``, which Lightning's own ``_pytree`` helper triggers;
- transformers' deprecation of ``is_gradient_checkpointing``, which peft reads when it wraps a model;
- Lightning's "Tip" lines advertising its cloud logger and model registry;
- bitsandbytes' advice to ``pip install kernels`` for a faster CPU 4-bit kernel, logged as it is imported;
- DeepSpeed's "Setting accelerator to CPU" line, logged as it is imported on a machine without a GPU;
- Lightning's notice that ``tensorboardX`` is no longer its dependency, given when a trainer is built without a
  logger (``export``, ``generate``), and its warning "No seed found, seed set to 0", which its info line
  "Seed set to 0" repeats.

The filters must be installed before those packages are imported: the ``skiptrain.cli`` package installs them as
it is imported (:func:`silence_third_party_noise`), so every command, ``--help`` included, starts quiet.
"""

from __future__ import annotations

import logging
import warnings

LIGHTNING_LOGGER = "lightning.pytorch.utilities.rank_zero"
"""The logger through which Lightning (and skiptrain) print their info lines."""

DROPPED_LOG_LINES: dict[str, tuple[tuple[str | tuple[str, ...], str], ...]] = {
    # logger name -> (record.module or modules, the start of the message)
    LIGHTNING_LOGGER: ((("logger_connector", "callback_connector"), "💡 Tip:"),),
    "bitsandbytes.backends.cpu.ops": (("ops", "Failed to load CPU gemm_4bit_forward from kernels-community"),),
    "DeepSpeed": (("real_accelerator", "Setting accelerator to CPU."),),
}
"""Log lines dropped, by logger, the module that logs them and how their text starts."""

DROPPED_WARNINGS: tuple[tuple[str, type[Warning], str], ...] = (
    # (message regex, category, module regex) as warnings.filterwarnings takes them
    (r"`isinstance\(treespec, LeafSpec\)` is deprecated", FutureWarning, r"lightning\.pytorch\.utilities\._pytree"),
    (r"`is_gradient_checkpointing` is deprecated", FutureWarning, r"transformers\.modeling_utils"),
    (r"Starting from v1\.9\.0, `tensorboardX` has been removed", UserWarning,
     r"lightning\.pytorch\.trainer\.connectors\.logger_connector"),
    (r"No seed found, seed set to", UserWarning, r"lightning\.fabric\.utilities\.seed"),
)
"""Python warnings dropped."""


class _DropLines(logging.Filter):
    """Drops the records of one logger listed in :data:`DROPPED_LOG_LINES`."""

    def __init__(self, dropped: tuple[tuple[str | tuple[str, ...], str], ...]) -> None:
        super().__init__()
        self.dropped = dropped

    def filter(self, record: logging.LogRecord) -> bool:
        text = str(record.msg)
        return not any(record.module in ((modules,) if isinstance(modules, str) else modules)
                       and text.startswith(start) for modules, start in self.dropped)


def silence_third_party_noise() -> None:
    """Install the filters above (idempotent)."""
    for message, category, module in DROPPED_WARNINGS:
        warnings.filterwarnings("ignore", message=message, category=category, module=module)
    for name, dropped in DROPPED_LOG_LINES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLines) for f in logger.filters):
            logger.addFilter(_DropLines(dropped))
