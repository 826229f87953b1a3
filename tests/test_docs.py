"""The documentation is tested: every fenced block of README.md and docs/*.md runs or is marked as not run.

Marker convention (an HTML comment on the line right above a block's opening fence; several may be stacked):

- ``<!-- illustrative -->`` (optionally ``<!-- illustrative: why -->``): shown, not run (cluster commands, hub
  models, placeholder paths).
- ``<!-- test-command -->``: README only; the block CI runs (``.ci/run`` extracts it).
- ``<!-- run by tests/test_x.py::test_name ... -->``: exercised by the named test, which must exist.
- ``<!-- expected-output -->`` on a ``text`` or ``json`` block: the exact stdout of the nearest ``python`` block above.

Unmarked blocks are checked here, by language: ``python`` blocks are executed (self-contained, fast) and compared
with their expected output; ``bash`` blocks may only hold parse-only ``python -m skiptrain ... --help`` or
``--print_config`` commands, run in-process; ``yaml`` blocks are config fragments that must parse stacked on
``recipes/quickstart.yaml``; ``json`` blocks must be valid JSON. Any other block must be marked. When a python
block's output changes on purpose, run the block and paste what it prints into its expected-output block.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(?P<ticks>`{3,})(?P<lang>[\w-]*)\s*$")
MARKER = re.compile(r"^<!--\s*(?P<text>.*?)\s*-->\s*$")
RUN_BY = re.compile(r"^run by (?P<file>tests/[\w/.-]+\.py)::(?P<test>\w+)")
SHELLS = {"bash", "sh", "shell", "console"}
PARSE_ONLY = {"--help", "-h", "--print_config"}
# Spelled in two pieces so that this file does not contain what it looks for.
OUTSIDE_REFERENCES = ("METHOD" + ".md", "../shared" + "/docs")


@dataclass(frozen=True)
class Block:
    """A fenced block of a Markdown file."""

    path: Path
    line: int
    """1-based line of the opening fence."""
    lang: str
    text: str
    markers: tuple[str, ...]
    """Texts of the HTML comments on the lines right above the opening fence, top to bottom."""

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    def has(self, marker: str) -> bool:
        return any(m == marker or m.startswith(marker + ":") for m in self.markers)

    @property
    def run_by(self) -> re.Match | None:
        return next((m for m in map(RUN_BY.match, self.markers) if m), None)


def read_blocks(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with the markers above it."""
    lines = path.read_text().splitlines()
    blocks, index = [], 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if not opening:
            index += 1
            continue
        markers, above = [], index - 1
        while above >= 0 and MARKER.match(lines[above]):
            markers.insert(0, MARKER.match(lines[above])["text"])
            above -= 1
        end = index + 1
        while end < len(lines) and lines[end].strip() != opening["ticks"]:
            end += 1
        if end == len(lines):
            raise AssertionError(f"{path.relative_to(ROOT)}:{index + 1}: unclosed code fence")
        blocks.append(Block(path, index + 1, opening["lang"].lower(), "\n".join(lines[index + 1:end]), tuple(markers)))
        index = end + 1
    return blocks


BLOCKS = [block for path in DOCS for block in read_blocks(path)]


def blocks_of(*langs: str) -> list[Block]:
    return [b for b in BLOCKS if b.lang in langs]


def expected_output(block: Block) -> Block | None:
    """The ``expected-output`` block that belongs to a python block (before the next python block), if any."""
    same_file = [b for b in BLOCKS if b.path == block.path and b.line > block.line]
    for later in same_file:
        if later.lang == "python":
            return None
        if later.has("expected-output"):
            return later
    return None


def normalise(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip("\n").splitlines())


# -- every block is accounted for --------------------------------------------------------------------------------------
def test_the_docs_have_blocks_to_check():
    assert {p.name for p in DOCS} >= {"README.md", "method.md", "export-format.md", "cli.md", "scale-out.md"}
    assert blocks_of("python") and blocks_of(*SHELLS)


@pytest.mark.parametrize("block", BLOCKS, ids=lambda b: b.name)
def test_every_block_is_run_or_marked(block):
    """A block is run here (by its language), run by CI or a named test, an expected output, or illustrative."""
    if block.has("illustrative"):
        return
    if block.has("test-command"):
        assert block.path.name == "README.md" and block.path.parent == ROOT and block.lang in SHELLS, (
            f"{block.name}: only the README's bash test command is run by CI")
        return
    if block.run_by:
        test_file = ROOT / block.run_by["file"]
        assert test_file.is_file(), f"{block.name}: {block.run_by['file']} does not exist"
        assert re.search(rf"^def {block.run_by['test']}\(", test_file.read_text(), re.M), (
            f"{block.name}: {block.run_by['file']} has no test {block.run_by['test']}")
        return
    if block.has("expected-output"):
        assert block.lang in ("text", "json"), f"{block.name}: an expected output is a text or json block"
        owners = [b for b in blocks_of("python") if b.path == block.path and b.line < block.line]
        assert owners and expected_output(owners[-1]) == block and not owners[-1].has("illustrative"), (
            f"{block.name}: an expected output follows the run python block it belongs to")
        return
    assert block.lang in ("python", "yaml", "yml", "json", *SHELLS), (
        f"{block.name}: a {block.lang or 'plain'} block is never run: mark it <!-- illustrative --> "
        "or <!-- expected-output --> (see tests/test_docs.py)")


def test_the_test_command_is_the_one_ci_extracts():
    readme = (ROOT / "README.md").read_text().splitlines()
    assert readme.count("<!-- test-command -->") == 1
    (block,) = [b for b in BLOCKS if b.has("test-command")]
    assert block.lang == "bash" and block.path == ROOT / "README.md"
    # .ci/run's own extraction, run on the README: the command CI runs is the block this file parses
    ci = (ROOT / ".ci" / "run").read_text()
    extraction = re.search(r"^command=\$\(awk '(?P<program>[^']+)' README\.md\)$", ci, re.M)
    assert extraction, ".ci/run no longer extracts its command from README.md with awk"
    extracted = subprocess.run(["awk", extraction["program"], "README.md"], cwd=ROOT, capture_output=True, text=True,
                               check=True).stdout
    assert extracted.strip() and normalise(extracted) == normalise(block.text)


# -- python ------------------------------------------------------------------------------------------------------------
RUN_PYTHON = [b for b in blocks_of("python") if not (b.has("illustrative") or b.run_by)]


@pytest.mark.parametrize("block", RUN_PYTHON, ids=lambda b: b.name)
def test_python_block_runs_and_prints_its_expected_output(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a snippet that writes files writes them here
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout):
        exec(compile(block.text, block.name, "exec"), {"__name__": "__docs__"})  # noqa: S102
    expected = expected_output(block)
    if expected is not None:
        assert normalise(stdout.getvalue()) == normalise(expected.text), (
            f"{block.name} printed something else than {expected.name} shows")


# -- shell -------------------------------------------------------------------------------------------------------------
def shell_commands(text: str) -> list[list[str]]:
    """The commands of a shell block: continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    return [words for line in joined.splitlines() if (words := shlex.split(line, comments=True))]


RUN_SHELL = [b for b in blocks_of(*SHELLS) if not (b.has("illustrative") or b.has("test-command") or b.run_by)]


@pytest.mark.parametrize("block", RUN_SHELL, ids=lambda b: b.name)
def test_shell_block_runs_in_process(block, monkeypatch):
    from skiptrain.cli.app import main

    commands = shell_commands(block.text)
    assert commands, f"{block.name}: an empty shell block"
    monkeypatch.chdir(ROOT)  # commands use repository paths (recipes/...)
    for words in commands:
        assert words[:3] == ["python", "-m", "skiptrain"] and PARSE_ONLY & set(words), (
            f"{block.name}: `{shlex.join(words)}` is not a parse-only `python -m skiptrain ... --help` or "
            "`--print_config` command: mark the block <!-- illustrative --> or <!-- run by tests/...::test_... -->")
        code = 0
        with contextlib.redirect_stdout(io.StringIO()):
            try:
                main(words[3:])
            except SystemExit as exit_:
                code = exit_.code or 0
        assert code == 0, f"{block.name}: `{shlex.join(words)}` exited with {code}"


# -- yaml and json -----------------------------------------------------------------------------------------------------
RUN_YAML = [b for b in blocks_of("yaml", "yml") if not (b.has("illustrative") or b.run_by)]


@pytest.mark.parametrize("block", RUN_YAML, ids=lambda b: b.name)
def test_yaml_block_is_a_config_fragment_that_parses(block, tmp_path, monkeypatch):
    from skiptrain.cli.app import main

    assert isinstance(yaml.safe_load(block.text), dict), f"{block.name}: not a YAML mapping"
    fragment = tmp_path / "fragment.yaml"
    fragment.write_text(block.text + "\n")
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", str(ROOT / "recipes" / "quickstart.yaml"), "--config", str(fragment), "--print_config"]
    with contextlib.redirect_stdout(io.StringIO()), pytest.raises(SystemExit) as exit_:
        main(args)
    assert not exit_.value.code, f"{block.name}: the fragment does not parse on recipes/quickstart.yaml"


@pytest.mark.parametrize("block", [b for b in blocks_of("json") if not b.has("illustrative")], ids=lambda b: b.name)
def test_json_block_is_valid_json(block):
    json.loads(block.text)


# -- links and the index -----------------------------------------------------------------------------------------------
LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
LINKED = [*DOCS, *sorted((ROOT / "benchmarks").glob("*.md"))]


def anchors(path: Path) -> Iterator[str]:
    """The anchors GitHub gives the headings of a Markdown file (lower case, punctuation dropped, spaces to
    hyphens, ``-1``, ``-2`` ... for repeats)."""
    text = re.sub(r"^(`{3,}).*?^\1", "", path.read_text(), flags=re.M | re.S)
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        seen[slug] = seen.get(slug, -1) + 1
        yield slug if seen[slug] == 0 else f"{slug}-{seen[slug]}"


@pytest.mark.parametrize("path", LINKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path):
    """Every relative link reaches a file, and a link to a heading of a Markdown file reaches that heading."""
    text = re.sub(r"^(`{3,}).*?^\1", "", path.read_text(), flags=re.M | re.S)  # links inside code do not count
    broken = []
    for match in LINK.finditer(text):
        target, _, anchor = match["target"].partition("#")
        if re.match(r"^[a-z]+:", target):
            continue
        file = path.parent / target if target else path
        if not file.exists() or (anchor and file.suffix == ".md" and anchor not in set(anchors(file))):
            broken.append(match["target"])
    assert not broken, f"{path.relative_to(ROOT)} links to missing files or headings: {broken}"


def test_the_docs_index_links_every_doc():
    index = (ROOT / "docs" / "README.md").read_text()
    readme = (ROOT / "README.md").read_text()
    for doc in sorted((ROOT / "docs").glob("*.md")):
        if doc.name != "README.md":
            assert f"]({doc.name}" in index, f"docs/README.md does not link {doc.name}"
            assert f"](docs/{doc.name}" in readme, f"README.md does not link docs/{doc.name}"


# -- the export format specification matches what an export writes ----------------------------------------------------
SPEC = ROOT / "docs" / "export-format.md"
TOKENIZER_FILES = ("tokenizer", "special_tokens_map", "vocab", "merges", "added_tokens", "chat_template")


def documented_schema_keys(optional: bool = False) -> set[str]:
    """First-column keys of the tables in the section of docs/export-format.md on skip_schedule.json's keys (with
    ``optional``, only those whose type says ``optional``)."""
    keys, inside = set(), False
    for line in SPEC.read_text().splitlines():
        if line.startswith("## "):
            inside = "keys" in line.lower() and "skip_schedule.json" in line
        elif inside and (cell := re.match(r"^\|\s*`(\w+)`\s*\|([^|]*)\|", line)):
            if not optional or "optional" in cell[2]:
                keys.add(cell[1])
    return keys


@pytest.fixture(scope="module")
def exports(tiny_model_dir, tmp_path_factory):
    """A merged export and an adapter-only export of a tiny random model, written by the CLI."""
    from skiptrain.cli.app import main

    model_dir, root = tiny_model_dir("llama"), tmp_path_factory.mktemp("doc_exports")
    common = ["export", "--model.model", model_dir, "--model.schedule", "SkipDecode",
              "--model.schedule.min_layers", "2", "--model.schedule.decay_tokens", "4"]
    main([*common, "--output_dir", str(root / "merged")])
    main([*common, "--model.lora", "{r: 4, lora_alpha: 8, lora_dropout: 0}", "--adapter_only", "true",
          "--output_dir", str(root / "adapter")])
    return root / "merged", root / "adapter"


def test_the_spec_documents_every_key_of_skip_schedule_json(exports):
    documented, optional = documented_schema_keys(), documented_schema_keys(optional=True)
    for export in exports:
        written = set(json.loads((export / "skip_schedule.json").read_text()))
        assert written <= documented and documented - written <= optional, (
            f"docs/export-format.md documents {sorted(documented)}; an export writes {sorted(written)}")


def test_the_spec_names_every_file_an_export_writes(exports):
    spec = SPEC.read_text()
    for export in exports:
        names = {p.name for p in export.iterdir() if not p.name.startswith(TOKENIZER_FILES)}
        missing = sorted(n for n in names if f"`{n}`" not in spec)
        assert not missing, f"docs/export-format.md does not name {missing} (written to {export.name} exports)"
    merged, adapter = exports
    assert (merged / "config.json").is_file() and not (adapter / "config.json").exists()
    mirror = json.loads((merged / "config.json").read_text())["skip_schedule"]
    assert mirror == json.loads((merged / "skip_schedule.json").read_text())


# -- the project carries its own documentation ------------------------------------------------------------------------
def test_no_project_file_points_outside_the_project():
    """A clone holds only the project: no file may send the reader to material beside the checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                                capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout: the project's files cannot be listed")
    found = []
    for name in sorted(set(filter(None, listed.decode().split("\0")))):
        path = ROOT / name
        if not path.is_file():
            continue  # deleted in the working tree
        for number, line in enumerate(path.read_bytes().splitlines(), start=1):
            for needle in OUTSIDE_REFERENCES:
                if needle.encode() in line:
                    found.append(f"{name}:{number}: {needle}")
    assert not found, "files refer to documentation outside the project (point to docs/ instead):\n" + "\n".join(found)
