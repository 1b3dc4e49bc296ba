"""What the embedding example's producer, workers and search share: the
model, how text becomes chunks, where documents come from, and the refs file.

The model is wordllama's 256-d ``l2_supercat`` (average-pooled token
embeddings; numpy and tokenizers, no torch), loaded from the files its wheel
ships so that nothing is downloaded.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MODEL = "wordllama-256"  # the workq model name tasks are enqueued under
DIM = 256
# wordllama compares dense embeddings by cosine similarity; inner product over
# unit vectors is the same ranking, and faiss's exact ip search needs no training.
METRIC = "ip"


@dataclass(frozen=True)
class Doc:
    """A document: ``id`` is its number in the corpus (the vector id of its chunks)."""

    id: int
    name: str
    text: str


def load_model() -> Any:
    """wordllama's 256-d model, from the installed package's own files.

    ``WordLlama.load`` looks for weights in ``<package>/weights`` but for the
    tokenizer in ``<cache_dir>/tokenizers`` (its package-root lookup uses the
    singular ``tokenizer``), so the package folder is passed as the cache
    and downloads are disabled: the wheel holds both files.
    """
    import wordllama  # the optional `examples` extra: imported here so the rest works without it

    package_dir = Path(wordllama.__file__).parent
    return wordllama.WordLlama.load(config="l2_supercat", dim=DIM, cache_dir=package_dir, disable_download=True)


def embed(model: Any, texts: list[str]) -> np.ndarray:
    """float32 [len(texts), DIM] unit vectors (a text without tokens gives zeros, not NaN)."""
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    vectors = np.asarray(model.embed(texts, norm=False), dtype=np.float32)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = np.zeros_like(vectors)
    # wordllama's own norm=True divides by zero for an empty text; the store refuses NaN
    np.divide(vectors, norms, out=unit, where=norms > 0)
    return unit


def chunks(text: str, max_chars: int) -> list[str]:
    """``text`` cut at whitespace into pieces of at most ``max_chars`` (a longer word is cut)."""
    words = text.split()
    pieces: list[str] = []
    current = ""
    for word in words:
        while len(word) > max_chars:
            if current:
                pieces.append(current)
                current = ""
            pieces.append(word[:max_chars])
            word = word[max_chars:]
        if not word:
            continue
        if current and len(current) + 1 + len(word) > max_chars:
            pieces.append(current)
            current = word
        else:
            current = f"{current} {word}" if current else word
    if current:
        pieces.append(current)
    return pieces


def parse_dumpavail(text: str) -> Iterator[tuple[str, str]]:
    """(package, description) per stanza of ``apt-cache dumpavail`` output.

    The description is the synopsis plus the extended lines when the index
    has them (continuation lines; `` .`` is an empty line).
    """
    for stanza in text.split("\n\n"):
        package = ""
        description: list[str] = []
        in_description = False
        for line in stanza.splitlines():
            if line.startswith((" ", "\t")):
                if in_description:
                    body = line.strip()
                    description.append("" if body == "." else body)
                continue
            in_description = line.startswith("Description:")
            if line.startswith("Package:"):
                package = line.partition(":")[2].strip()
            elif in_description:
                description.append(line.partition(":")[2].strip())
        if package and description:
            yield package, "\n".join(description).strip()


def debian_docs() -> list[Doc]:
    """One document per package that ``apt-cache dumpavail`` lists: "name: description"."""
    out = subprocess.run(["apt-cache", "dumpavail"], check=True, capture_output=True, text=True).stdout
    seen: set[str] = set()
    docs: list[Doc] = []
    for package, description in parse_dumpavail(out):
        if package not in seen:  # several versions of one package: the first listed
            seen.add(package)
            docs.append(Doc(len(docs), package, f"{package}: {description}"))
    return docs


def paragraph_docs(path: Path) -> list[Doc]:
    """One document per paragraph (lines up to a blank line) of a UTF-8 text
    file, named ``<file>:<line>`` after the line it starts on; whitespace runs
    inside a paragraph become single spaces."""
    docs: list[Doc] = []
    lines: list[str] = []
    start = 0
    for number, line in enumerate([*path.read_text(encoding="utf-8").splitlines(), ""], start=1):
        if line.strip():
            if not lines:
                start = number
            lines.append(line.strip())
        elif lines:
            docs.append(Doc(len(docs), f"{path.name}:{start}", " ".join(" ".join(lines).split())))
            lines = []
    return docs


def write_refs(path: Path, header: dict[str, Any], docs: Iterable[Doc], refs: dict[int, list[int]]) -> None:
    """The refs file: a JSON header line, then one line per document
    ``{"id", "name", "text", "refs"}`` (refs in chunk order); written to a
    temporary name and renamed, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as f:
        f.write(json.dumps(header) + "\n")
        for doc in docs:
            f.write(json.dumps({"id": doc.id, "name": doc.name, "text": doc.text, "refs": refs[doc.id]}) + "\n")
    tmp.replace(path)


def read_refs(path: Path) -> tuple[dict[str, Any], list[Doc], dict[int, list[int]]]:
    """(header, docs, doc id -> refs) from a file :func:`write_refs` wrote."""
    with path.open(encoding="utf-8") as f:
        header = json.loads(f.readline())
        docs: list[Doc] = []
        refs: dict[int, list[int]] = {}
        for line in f:
            row = json.loads(line)
            docs.append(Doc(row["id"], row["name"], row["text"]))
            refs[row["id"]] = row["refs"]
    return header, docs, refs
