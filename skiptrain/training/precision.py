"""``trainer.precision: auto`` resolved for the device, and the warning for a precision the device only emulates.

The table of what ``auto`` becomes is :mod:`skiptrain.modeling.precision`'s; the device is probed there too.
"""

from __future__ import annotations

from skiptrain.core import log
from skiptrain.modeling.precision import AUTO, probe_device

BF16_SLOWDOWN = "bf16 matrix products run tens of times slower than fp32 there"
"""What an emulated bf16 costs: a 1024x1024 product on one thread runs 48x (an AVX2 EPYC) to 112x (AVX2 kernels only
on a Xeon) slower in bf16 than in fp32 (benchmarks/RESULTS.md, "Precision on CPUs")."""


class PrecisionWarning(UserWarning):
    """An explicit precision that the device can only emulate."""


def resolve_precision(precision: object, accelerator: object = "auto") -> object:
    """The precision to give Lightning for ``precision``: ``auto`` resolved by the table of
    :mod:`skiptrain.modeling.precision`, said in one line.

    Any other value is returned as given, with a :class:`PrecisionWarning` when the device only emulates it.
    """
    text = str(precision)
    if text == AUTO:
        device = probe_device(accelerator)
        chosen = "bf16-mixed" if device.native_bf16 else "16-mixed" if device.cuda else "32-true"
        log.info(f"skiptrain: precision auto -> {chosen}: {device.name}, {device.why}")
        return chosen
    if text.startswith("bf16"):
        device = probe_device(accelerator)
        if not device.native_bf16:
            log.warn(f"precision={text} on {device.name}, which has {device.why}: {BF16_SLOWDOWN}; use "
                     "--trainer.precision auto (or 32-true) to train at this device's speed", PrecisionWarning)
    return precision


__all__ = ["BF16_SLOWDOWN", "PrecisionWarning", "resolve_precision"]
