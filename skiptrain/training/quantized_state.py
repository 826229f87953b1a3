"""A QLoRA module's state dict without its 4-bit base weights: frozen, they are quantized again from the base model
when it loads, so checkpoints keep only what trains (and what full precision holds)."""

from __future__ import annotations

from typing import Any

from torch import nn

from skiptrain.modeling.quantization import is_under, quantized_weight_names


class WithoutQuantizedBase(nn.Module):
    """Mixed into a LightningModule whose ``quantization`` (``None``: full precision) and ``model`` attributes say
    whether its base weights are quantized."""

    quantization: Any
    model: nn.Module | None

    def _quantized_weights(self) -> tuple[str, ...]:
        return quantized_weight_names(self) if self.quantization is not None and self.model is not None else ()

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """As torch's, without quantized base weights (QLoRA): frozen, they are quantized again from ``model``."""
        state = super().state_dict(*args, **kwargs)
        frozen = self._quantized_weights()
        for key in [k for k in state if is_under(k, frozen)] if frozen else ():
            del state[key]
        return state

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        """As torch's; quantized base weights, which :meth:`state_dict` leaves out, may be missing."""
        frozen = self._quantized_weights()
        if not frozen:
            return super().load_state_dict(state_dict, strict=strict, assign=assign)
        result = super().load_state_dict(state_dict, strict=False, assign=assign)
        result.missing_keys[:] = [k for k in result.missing_keys if not is_under(k, frozen)]
        if strict and (result.missing_keys or result.unexpected_keys):
            raise RuntimeError(f"Error(s) in loading state_dict for {type(self).__name__}: missing keys "
                               f"{result.missing_keys}, unexpected keys {result.unexpected_keys}")
        return result

