"""The vLLM plugin's parts that load without vLLM: its architecture list against skiptrain's architecture table and
the classes that serve it, and the ``hf_overrides`` it gives an export. (Engines: tests/test_vllm.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import skiptrain.serving.vllm_plugin as plugin
from skiptrain.modeling.architectures import ARCHITECTURES


def test_the_plugin_serves_only_architectures_of_the_table():
    """Each served transformers architecture is the causal LM class of a ``model_type`` skiptrain drives (a family
    the table lacks would have no exactness tests behind its vLLM class)."""
    table = {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]: model_type for model_type in ARCHITECTURES}
    assert set(plugin.ARCHITECTURES) <= set(table), sorted(set(plugin.ARCHITECTURES) - set(table))
    assert {table[name] for name in plugin.ARCHITECTURES} == {"llama", "mistral", "qwen2", "opt"}


def test_every_served_architecture_has_its_skip_aware_class_and_no_class_is_left_out():
    """The names :func:`~skiptrain.serving.vllm_plugin.register` registers are the classes of
    :mod:`skiptrain.serving.vllm_models`, each subclassing vLLM's class of the architecture it serves (read from the
    source: importing it needs vLLM)."""
    source = Path(plugin.__file__).with_name("vllm_models.py").read_text()
    classes = {node.name: {base.id for base in node.bases if isinstance(base, ast.Name)}
               for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    served = {name for name in classes if name.startswith("Skip") and name.endswith("ForCausalLM")}
    assert served == set(plugin.ARCHITECTURES.values())
    for architecture, skip_class in plugin.ARCHITECTURES.items():
        assert architecture in classes[skip_class], f"{skip_class} serves {architecture}"


def test_hf_overrides_name_the_skip_aware_class_or_refuse_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert plugin.hf_overrides(tmp_path) == {"architectures": ["SkipQwen2ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    with pytest.raises(ValueError, match=r"architectures=\['GPT2LMHeadModel'\] has no skip-aware vLLM class: allowed "
                                         r"\['LlamaForCausalLM', 'MistralForCausalLM', 'OPTForCausalLM', "
                                         r"'Qwen2ForCausalLM'\]"):
        plugin.hf_overrides(tmp_path)
