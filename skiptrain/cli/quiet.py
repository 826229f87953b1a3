"""A quiet start: silence the third-party messages a skiptrain run cannot act on, each by its text and origin.

Only these are dropped, so any other warning still shows:

- torch's deprecation of ``isinstance(treespec, LeafSpec)``, which Lightning's own ``_pytree`` helper triggers;
- transformers' deprecation of ``is_gradient_checkpointing``, which peft reads when it wraps a model;
- Lightning's "Tip" lines advertising its cloud logger and model registry.
"""

from __future__ import annotations

import logging
import warnings

LIGHTNING_LOGGER = "lightning.pytorch.utilities.rank_zero"
"""The logger through which Lightning (and skiptrain) print their info lines."""
TIP_MODULES = ("logger_connector", "callback_connector")
"""Lightning modules whose "💡 Tip:" lines advertise its cloud services."""


class _DropLightningTips(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.module in TIP_MODULES and str(record.msg).startswith("💡 Tip:"))


def silence_third_party_noise() -> None:
    """Install the filters above (idempotent)."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning,
                            module=r"transformers\.modeling_utils")
    logger = logging.getLogger(LIGHTNING_LOGGER)
    if not any(isinstance(f, _DropLightningTips) for f in logger.filters):
        logger.addFilter(_DropLightningTips())
