"""Search a collection examples/embed_corpus.py filled, by the meaning of a text.

    python examples/search.py "a tool to resize photos"
    python examples/search.py --collection debian -k 5 "read e-mail in a terminal"

Embeds the query with the model the corpus was embedded with, searches the
collection exactly (inner product of unit vectors: cosine similarity, 1.0
for the same text) and prints the nearest documents, best first, one line
each: rank, score, name, the start of the text. A document cut into several
chunks is listed once, at its best chunk's score.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from embedtext import Doc, embed, load_model, read_refs

from shardmgr.store.client import StoreClient

OVERFETCH = 4  # chunks asked per document wanted, as one document's chunks can crowd the top


def nearest(store: StoreClient, model: Any, collection: str, docs: dict[int, Doc], query: str,
            k: int) -> list[tuple[float, Doc]]:
    """Up to ``k`` (score, document) pairs nearest to ``query``, best first.

    A vector's id is its document's number, so a hit is named through the
    id: that also names a row no result reported (a task a worker appended
    twice because its lease ended before it completed), as the same chunk.
    """
    scores, ids, refs = store.search(collection, embed(model, [query]), k=k * OVERFETCH)
    hits: list[tuple[float, Doc]] = []
    for score, vector_id, ref in zip(scores[0].tolist(), ids[0].tolist(), refs[0].tolist()):
        if ref < 0:  # fewer vectors than asked for
            break
        if any(doc.id == vector_id for _, doc in hits):
            continue
        hits.append((score, docs.get(vector_id) or Doc(vector_id, f"<id {vector_id}: not in the refs file>", "")))
        if len(hits) == k:
            break
    return hits


@click.command()
@click.argument("query")
@click.option("--collection", default="docs", show_default=True)
@click.option("--refs", "refs_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The refs file embed_corpus.py wrote  [default: <collection>.refs.jsonl]")
@click.option("--address", default="127.0.0.1:7300", show_default=True, help="The shardmgr server.")
@click.option("-k", default=10, show_default=True, type=click.IntRange(1, 1000), help="Documents to list.")
@click.option("--width", default=100, show_default=True, type=click.IntRange(0), help="Characters of text shown.")
def main(query: str, collection: str, refs_file: Path | None, address: str, k: int, width: int) -> None:
    """Print the documents nearest to QUERY, with their cosine similarity."""
    refs_file = refs_file or Path(f"{collection}.refs.jsonl")
    if not refs_file.exists():
        raise click.UsageError(f"no refs file {refs_file}: pass --refs, or run embed_corpus.py first")
    header, docs, _refs = read_refs(refs_file)
    if header["collection"] != collection:
        raise click.UsageError(f"{refs_file} is of collection {header['collection']!r}, not {collection!r}")
    model = load_model()
    with StoreClient(address) as store:
        hits = nearest(store, model, collection, {doc.id: doc for doc in docs}, query, k)
    for rank, (score, doc) in enumerate(hits, start=1):
        text = " ".join(doc.text.split())
        text = text.removeprefix(f"{doc.name}: ")  # a Debian document starts with its name
        snippet = text if len(text) <= width else text[:max(0, width - 1)] + "…"
        click.echo(f"{rank:>3}  {score:.4f}  {doc.name}  {snippet}")


if __name__ == "__main__":
    main()
