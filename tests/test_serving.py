"""The vLLM plugin's parts that load without vLLM: its architecture list against skiptrain's architecture table and
the classes that serve it, and the ``hf_overrides`` it gives an export. (Engines: tests/test_vllm.py.)"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from helpers import vllm_cases
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

import skiptrain.serving.vllm_plugin as plugin
from skiptrain.modeling.architectures import ARCHITECTURES


def test_the_plugin_serves_every_architecture_of_the_table_and_no_other():
    """Each served transformers architecture is the causal LM class of a ``model_type`` skiptrain drives (a family
    the table lacks would have no exactness tests behind its vLLM class), and every family skiptrain trains is
    served, each with its engine test (tests/helpers/vllm_cases.py)."""
    table = {MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type]: model_type for model_type in ARCHITECTURES}
    assert set(plugin.ARCHITECTURES) <= set(table), sorted(set(plugin.ARCHITECTURES) - set(table))
    assert {table[name] for name in plugin.ARCHITECTURES} == set(ARCHITECTURES)
    assert set(vllm_cases.FAMILIES) == set(ARCHITECTURES)


def test_every_served_architecture_has_its_skip_aware_class_and_no_class_is_left_out():
    """The names :func:`~skiptrain.serving.vllm_plugin.register` registers are the classes of
    :mod:`skiptrain.serving.vllm_models`, each subclassing vLLM's class of the architecture it serves (read from the
    source: importing it needs vLLM)."""
    source = Path(plugin.__file__).with_name("vllm_models.py").read_text()
    classes = {node.name: {base.id for base in node.bases if isinstance(base, ast.Name)}
               for node in ast.parse(source).body if isinstance(node, ast.ClassDef)}
    served = {name for name in classes if name.startswith("Skip") and name.endswith(("ForCausalLM", "LMHeadModel"))}
    assert served == set(plugin.ARCHITECTURES.values())
    for architecture, skip_class in plugin.ARCHITECTURES.items():
        assert architecture in classes[skip_class], f"{skip_class} serves {architecture}"


def test_hf_overrides_name_the_skip_aware_class_or_refuse_in_one_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"]}))
    assert plugin.hf_overrides(tmp_path) == {"architectures": ["SkipQwen2ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma3ForCausalLM"]}))
    assert plugin.hf_overrides(tmp_path) == {"architectures": ["SkipGemma3ForCausalLM"]}
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["MixtralForCausalLM"]}))
    with pytest.raises(ValueError, match=r"^config.json architectures=\['MixtralForCausalLM'\] has no skip-aware vLLM "
                                         r"class: allowed \['GPT2LMHeadModel', 'Gemma2ForCausalLM', .*, "
                                         r"'Qwen3ForCausalLM'\]$"):
        plugin.hf_overrides(tmp_path)


def test_the_vllm_name_check_finds_missing_names_and_wrong_signatures(tmp_path):
    """The static check (skiptrain.serving.vllm_names) on a small tree: names bound directly, through imports and
    base classes, ``self.x`` attributes, call signatures and dataclass fields, and what it reports when they are
    wrong. (Against real vLLM releases: tests/test_vllm.py and docs/serving.md.)"""
    from skiptrain.serving.vllm_names import Tree

    package = tmp_path / "vllm"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("from .base import Base as Exported\n")
    (package / "sub" / "base.py").write_text(
        "from dataclasses import dataclass\n\n"
        "class Base:\n    def __init__(self, *, config, prefix=''):\n        self.model, self.layers = 1, 2\n\n"
        "@dataclass\nclass Fields:\n    a: int\n    b: int = 0\n")
    (package / "child.py").write_text(
        "from vllm.sub import Exported\n\nclass Child(Exported):\n    def forward(self, positions, hidden, **kw):\n"
        "        pass\n")
    tree = Tree(package)
    for met in ("vllm.sub:Exported", "vllm.child:Child.model", "vllm.child:Child.layers",
                "vllm.child:Child.__init__(config)", "vllm.child:Child.__init__(config, prefix)",
                "vllm.child:Child.forward(positions, hidden, residual)", "vllm.sub.base:Fields(a)",
                "vllm.sub.base:Fields(a, b)"):
        assert tree.missing(met) is None, met
    assert tree.missing("vllm.nowhere:X") == "vllm.nowhere:X: no module vllm.nowhere"
    assert tree.missing("vllm.child:Other") == "vllm.child:Other: vllm.child has no Other"
    assert tree.missing("vllm.child:Child.norm") == "vllm.child:Child.norm: Child has no attribute norm"
    assert tree.missing("vllm.child:Child.__init__(prefix)") == (
        "vllm.child:Child.__init__(prefix): the signature is (config, prefix): unknown [], required not given "
        "['config']")
    assert tree.missing("vllm.sub.base:Base.__init__(config, device)") == (
        "vllm.sub.base:Base.__init__(config, device): the signature is (config, prefix): unknown ['device'], "
        "required not given []")
    assert tree.missing("vllm.sub.base:Fields(b, c)") == (
        "vllm.sub.base:Fields(b, c): unknown fields ['c'], required fields not given ['a']")


def test_the_vllm_name_check_reads_the_plugins_own_imports():
    from skiptrain.serving.vllm_names import plugin_imports

    found = plugin_imports()
    assert {"vllm.forward_context:get_forward_context", "vllm.model_executor.models.gemma3:Gemma3ForCausalLM",
            "vllm.v1.sample.logits_processor:LogitsProcessor", "vllm:ModelRegistry"} <= set(found), found
