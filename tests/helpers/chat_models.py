"""A tiny model whose tokenizer has a chat template, for chat data and chat prompts."""

from __future__ import annotations

import shutil
from pathlib import Path

from transformers import AutoTokenizer

# the shape of SmolLM2-Instruct's template, without its default system turn
CHAT_TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
                 "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
                 "{% endif %}")


def with_chat_template(model_dir: str, target: Path) -> str:
    """A copy of ``model_dir`` at ``target`` whose tokenizer has :data:`CHAT_TEMPLATE`."""
    shutil.copytree(model_dir, target)
    tokenizer = AutoTokenizer.from_pretrained(str(target))
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(str(target))
    return str(target)
