"""``skiptrain export --push_to_hub``: huggingface_hub's own upload, against a local stand-in of the Hub's HTTP API
(repository creation, YAML validation, pre-upload and commit: the endpoints ``HfApi.upload_folder`` calls for files
it sends in the commit itself), and the one-line refusal offline."""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import huggingface_hub
import pytest
from huggingface_hub import constants

from skiptrain.cli.app import main


class StandInHub(BaseHTTPRequestHandler):
    """The Hub endpoints of an upload whose files all go in the commit payload; it keeps what was committed."""

    repos: set[str]
    committed: dict[str, bytes]

    def log_message(self, *args) -> None:
        pass

    def reply(self, body: dict, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply({"error": "not part of the stand-in"}, 404)

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


@pytest.fixture
def hub(monkeypatch):
    """A stand-in Hub on localhost, with huggingface_hub online and pointed at it."""
    handler = type("Hub", (StandInHub,), {"repos": set(), "committed": {}})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{server.server_port}")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_stand_in_token")
    yield handler
    server.shutdown()
    thread.join()


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
