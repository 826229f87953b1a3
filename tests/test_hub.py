"""Exports on the Hub, against a local stand-in of the Hub's HTTP API: ``skiptrain export --push_to_hub`` through
huggingface_hub's own upload (repository creation, YAML validation, pre-upload and commit: the endpoints
``HfApi.upload_folder`` calls for files it sends in the commit itself), ``--model.model <repo id>`` through its own
download into its cache (repository info, file tree, file metadata and content: the endpoints ``snapshot_download``
calls), that cache used offline, and the one-line refusals offline."""

from __future__ import annotations

import base64
import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlparse

import huggingface_hub
import pytest
from huggingface_hub import constants

from skiptrain.cli.app import main
from skiptrain.errors import ModelError
from skiptrain.export.load import load_exported

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class StandInHub(BaseHTTPRequestHandler):
    """The Hub endpoints of an upload whose files all go in the commit payload; it keeps what was committed."""

    repos: set[str]
    committed: dict[str, bytes]

    def log_message(self, *args) -> None:
        pass

    def reply(self, body: dict | list, status: int = 200, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                           **(headers or {})}.items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def do_HEAD(self) -> None:
        self.serve_file(body=False)

    def do_GET(self) -> None:
        path = urlparse(self.path).path
        if path.startswith("/api/models/"):
            repo, _, rest = path.removeprefix("/api/models/").partition("/tree/")
            if not rest:  # repository info: /api/models/{repo}/revision/{revision}
                repo = repo.split("/revision/")[0]
            if repo not in self.repos:
                return self.reply({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
            if rest:
                return self.reply([{"type": "file", "path": name, "size": len(data), "oid": _oid(data)}
                                   for name, data in self.committed.items()])
            return self.reply({"id": repo, "sha": COMMIT, "siblings": [{"rfilename": n} for n in self.committed]})
        self.serve_file(body=True)

    def serve_file(self, body: bool) -> None:
        """``/{repo}/resolve/{revision}/{file}``: a committed file's metadata headers, and its content."""
        repo, _, rest = urlparse(self.path).path.lstrip("/").partition("/resolve/")
        name = rest.partition("/")[2]
        if repo not in self.repos:
            return self.reply({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})
        if name not in self.committed:
            return self.reply({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"})
        data = self.committed[name]
        self.send_response(200)
        for key, value in {"X-Repo-Commit": COMMIT, "ETag": f'"{_oid(data)}"', "Content-Length": str(len(data)),
                           "Content-Type": "application/octet-stream"}.items():
            self.send_header(key, value)
        self.end_headers()
        if body:
            self.wfile.write(data)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        host = f"http://127.0.0.1:{self.server.server_port}"
        if self.path == "/api/repos/create":
            request = json.loads(body)
            repo = f"{request['organization']}/{request['name']}"
            self.repos.add(repo)
            return self.reply({"url": f"{host}/{repo}"})
        if self.path == "/api/validate-yaml":
            return self.reply({"errors": [], "warnings": []})
        if "/preupload/" in self.path:
            files = json.loads(body)["files"]
            return self.reply({"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                         for f in files]})
        if "/commit/" in self.path:
            for line in body.decode().splitlines():
                item = json.loads(line)
                if item["key"] == "file":
                    self.committed[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
            repo = self.path.split("/api/models/")[1].split("/commit/")[0]
            return self.reply({"commitUrl": f"{host}/{repo}/commit/{'0' * 40}", "commitOid": "0" * 40})
        return self.reply({"error": "not part of the stand-in"}, 404)


def _oid(data: bytes) -> str:
    return hashlib.sha1(data).hexdigest()


@pytest.fixture
def hub(monkeypatch):
    """A stand-in Hub on localhost, with huggingface_hub online and pointed at it."""
    handler = type("Hub", (StandInHub,), {"repos": set(), "committed": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint = f"http://127.0.0.1:{server.server_port}"
    monkeypatch.setattr(constants, "ENDPOINT", endpoint)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in_token")
    handler.stop = lambda: (server.shutdown(), thread.join())
    yield handler
    server.shutdown()
    thread.join()


@pytest.fixture
def hub_cache(monkeypatch, tmp_path):
    """An empty huggingface_hub cache of the test's own."""
    cache = tmp_path / "hub_cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def export_args(model_dir: str, output_dir, *extra: str) -> list[str]:
    return ["export", "--model.model", model_dir, "--model.schedule", "SkipDecode", "--model.schedule.min_layers", "2",
            "--output_dir", str(output_dir), *extra]


def test_push_to_hub_uploads_every_file_of_the_export(hub, tiny_model_dir, tmp_path):
    out = tmp_path / "export"
    main(export_args(tiny_model_dir("llama"), out, "--push_to_hub", "someone/skip-model"))
    assert hub.repos == {"someone/skip-model"}
    written = {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    assert {"skip_schedule.json", "config.json", "model.safetensors", "README.md",
            "custom_generate/generate.py"} <= set(written)
    assert hub.committed == written


def test_push_to_hub_offline_is_refused_in_one_line_before_anything_is_written(tiny_model_dir, tmp_path, capsys):
    assert huggingface_hub.is_offline_mode(), "the tests run with HF_HUB_OFFLINE=1"
    out = tmp_path / "export"
    with pytest.raises(SystemExit) as exit_info:
        main(export_args(tiny_model_dir("llama"), out, "--push_to_hub", "someone/skip-model"))
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1].startswith("skiptrain export: error: push_to_hub='someone/skip-model' cannot be used offline")
    assert "Traceback" not in "\n".join(lines)
    assert not out.exists()


def test_push_to_hub_refuses_an_invalid_repository_id(tiny_model_dir, tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(export_args(tiny_model_dir("llama"), tmp_path / "export", "--push_to_hub", "not a repo/../x"))
    assert "push_to_hub='not a repo/../x' is invalid: allowed a Hub repository id" in capsys.readouterr().err


def generate_args(model: str, prompts, output) -> list[str]:
    return ["generate", "--model.model", model, "--prompts", str(prompts), "--output", str(output),
            "--raw_prompts", "true", "--max_new_tokens", "4"]


def test_an_export_on_the_hub_is_downloaded_into_the_cache_and_used_from_it_offline(
        hub, hub_cache, tiny_model_dir, tmp_path, monkeypatch):
    local = tmp_path / "export"
    main(export_args(tiny_model_dir("llama"), local, "--push_to_hub", "someone/skip-model"))
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello world\nthe cat\n")
    main(generate_args(str(local), prompts, tmp_path / "local.jsonl"))

    main(generate_args("someone/skip-model", prompts, tmp_path / "online.jsonl"))
    snapshot = hub_cache / "models--someone--skip-model" / "snapshots" / COMMIT
    assert {p.name for p in snapshot.iterdir()} >= {"skip_schedule.json", "model.safetensors", "config.json"}
    assert (tmp_path / "online.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()

    hub.stop()  # the cache alone serves it now
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    main(generate_args("someone/skip-model", prompts, tmp_path / "offline.jsonl"))
    assert (tmp_path / "offline.jsonl").read_text() == (tmp_path / "local.jsonl").read_text()


def test_a_plain_model_repository_is_not_taken_for_an_export(hub, hub_cache, tiny_model_dir):
    from skiptrain.export.hub import hub_export

    hub.repos.add("someone/plain-model")
    hub.committed["config.json"] = b"{}"
    assert hub_export("someone/plain-model") is None
    assert hub_export(tiny_model_dir("llama")) is None  # a local path is never looked up
    assert hub_export("smollm2-135m-instruct") is None  # nor a bundled name


def test_a_hub_id_offline_and_not_in_the_cache_is_refused_in_one_line(hub_cache, tmp_path, capsys):
    assert huggingface_hub.is_offline_mode(), "the tests run with HF_HUB_OFFLINE=1"
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("hello\n")
    with pytest.raises(SystemExit) as exit_info:
        main(generate_args("someone/skip-model", prompts, tmp_path / "out.jsonl"))
    assert exit_info.value.code
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines[-1] == ("skiptrain generate: error: model='someone/skip-model' is not in the local Hugging Face "
                         "cache and the hub is offline (HF_HUB_OFFLINE=1): download it while online, give a local "
                         "directory, or use the bundled offline model 'smollm2-135m-instruct'")
    assert "Traceback" not in "\n".join(lines)
    with pytest.raises(ModelError, match=r"^model='someone/skip-model' is not in the local Hugging Face cache"):
        load_exported("someone/skip-model")  # the Python API says the same
