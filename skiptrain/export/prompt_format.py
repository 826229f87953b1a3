"""The prompt format as :mod:`skiptrain.export.custom_generate` imports it.

``custom_generate`` ships inside every export and imports its prompt format relatively (``from .prompt_format
import ...``): in an export that finds the copy of :mod:`skiptrain.text.prompt_format` written beside
``custom_generate/generate.py``; inside skiptrain it finds this module, which is that same module.
"""

from skiptrain.text.prompt_format import PromptFormat, PromptFormatError, Source

__all__ = ["PromptFormat", "PromptFormatError", "Source"]
