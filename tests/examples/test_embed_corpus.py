"""examples/embed_corpus.py and examples/search.py end to end: a real server,
real worker processes, the real wordllama model, on a few hundred paragraphs
of Python's own docstrings (no network)."""

from __future__ import annotations

import importlib
import inspect
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import workq
from shardmgr.store.client import StoreClient
from tests.shardmgr.server.serverproc import ServerProcess

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(EXAMPLES))  # the examples import their sibling modules as scripts do
embedtext = importlib.import_module("embedtext")
search = importlib.import_module("search")

MODULES = ["math", "cmath", "os", "os.path", "shutil", "json", "re", "string", "textwrap", "itertools", "functools",
           "collections", "statistics", "random", "pathlib", "datetime", "heapq", "bisect", "struct", "zlib",
           "base64", "hashlib", "csv", "difflib", "fractions", "decimal", "operator", "glob", "fnmatch", "tempfile"]
DOCS = 300
CHUNK_CHARS = 200  # below the longest paragraphs, so some documents have several chunks


def first_paragraphs(module: ModuleType) -> Iterator[str]:
    """The first paragraph of the docstrings of a module and its public members."""
    for obj in [module, *(getattr(module, name) for name in sorted(dir(module)) if not name.startswith("_"))]:
        doc = inspect.getdoc(obj) if callable(obj) or obj is module else None
        if doc:
            yield " ".join(doc.split("\n\n")[0].split())


def write_corpus(path: Path) -> None:
    """DOCS paragraphs, none made of another's words (an average of token
    embeddings ignores order and punctuation, so math.degrees' "from radians
    to degrees" and math.radians' "from degrees to radians" would tie)."""
    seen: set[tuple[str, ...]] = set()
    paragraphs: list[str] = []
    for name in MODULES:
        for text in first_paragraphs(importlib.import_module(name)):
            words = tuple(sorted(re.findall(r"\w+", text.lower())))
            if len(text) >= 20 and words not in seen:
                seen.add(words)
                paragraphs.append(text)
    assert len(paragraphs) >= DOCS, "the stdlib's docstrings should give enough paragraphs"
    path.write_text("\n\n".join(paragraphs[:DOCS]) + "\n", encoding="utf-8")


def run_example(script: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(tmp_path / "data").start()
    yield proc
    proc.kill()


def test_embed_corpus_then_search(server: ServerProcess, tmp_path: Path) -> None:
    corpus, refs_file = tmp_path / "corpus.txt", tmp_path / "corpus.refs.jsonl"
    write_corpus(corpus)
    out = run_example("embed_corpus.py", "--text", str(corpus), "--address", server.address,
                      "--collection", "stdlib", "--chunk-chars", str(CHUNK_CHARS), "--out", str(refs_file))
    assert f"{DOCS} documents" in out and "docs/s" in out and "vectors/s" in out

    header, docs, refs = embedtext.read_refs(refs_file)
    assert docs == embedtext.paragraph_docs(corpus)  # every document, once, in corpus order
    chunks = {doc.id: embedtext.chunks(doc.text, CHUNK_CHARS) for doc in docs}
    assert {doc.id: len(refs[doc.id]) for doc in docs} == {doc.id: len(chunks[doc.id]) for doc in docs}
    assert any(len(c) > 1 for c in chunks.values())
    all_refs = [ref for doc in docs for ref in refs[doc.id]]
    assert len(set(all_refs)) == len(all_refs)

    model = embedtext.load_model()
    with StoreClient(server.address) as store, workq.connect(server.address) as client:
        # each chunk was appended once: no task ran twice, and the results name every row
        assert store.collection_info("stdlib")["rows"] == len(all_refs)
        status = client.job_status(header["job"])
        assert status["enqueued"] == status["completed"] == status["delivered"] > 1
        texts = [text for doc in docs for text in chunks[doc.id]]
        np.testing.assert_allclose(store.get("stdlib", all_refs), model.embed(texts, norm=True), atol=1e-6)
        assert store.ids("stdlib", all_refs).tolist() == [doc.id for doc in docs for _ in refs[doc.id]]

        by_id = {doc.id: doc for doc in docs}
        for doc in docs:
            if len(chunks[doc.id]) == 1:  # its own text is its one vector
                [(score, first)] = search.nearest(store, model, "stdlib", by_id, doc.text, k=1)
                assert first == doc and score == pytest.approx(1.0, abs=1e-4)

    target = next(doc for doc in docs if len(chunks[doc.id]) == 1)
    lines = run_example("search.py", "--address", server.address, "--collection", "stdlib", "--refs",
                        str(refs_file), "-k", "3", target.text).splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["1", "1.0000", target.name]
