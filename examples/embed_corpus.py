"""Embed a corpus through workq into a shardmgr collection, end to end.

    python examples/embed_corpus.py --debian                 # every package apt knows
    python examples/embed_corpus.py --text notes.txt --workers 4

One command, against a running ``shardmgr serve`` (it starts no server): it
starts N worker processes, reads the documents, cuts them into chunks,
enqueues the chunks as workq tasks (model ``wordllama-256``), and collects
the tasks' results while the workers embed the chunks, append the vectors
(one per chunk, id = the document's number) and complete each task with the
refs the store returned. It then writes ``doc -> refs`` to a JSON-lines file
(embedtext.write_refs) and prints the time per phase and the throughput.
A run writes into an empty collection only, so every vector in it is one of
this run's and examples/search.py can name every hit.
"""

from __future__ import annotations

import math
import multiprocessing
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from embed_worker import SHAPE, Task, WorkerStats, decode_result, work
from embedtext import DIM, METRIC, MODEL, Doc, chunks, debian_docs, paragraph_docs, write_refs
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

import workq
from common.wire.errors import Unavailable
from shardmgr.store.client import StoreClient

ENQUEUE_TASKS = 16  # tasks per enqueue call: a few MB per request at most
CONNECT_S = 5.0  # how long the first call tries to reach the server before saying it cannot
TASKS_PER_WORKER = 4  # a small corpus still gets at least this many tasks per worker to share


class Run:
    """One run's settings and what it measured."""

    def __init__(self, address: str, collection: str, workers: int) -> None:
        self.address = address
        self.collection = collection
        self.workers = workers
        run = secrets.token_hex(4)
        self.job = f"embed-{collection}-{run}"
        self.lane = f"run-{run}"
        self.phases: dict[str, float] = {}
        self.started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as phase ``name``."""
        started = time.perf_counter()
        yield
        self.phases[name] = time.perf_counter() - started


def plan_tasks(collection: str, docs: list[Doc], chunk_chars: int, task_chunks: int, workers: int) -> list[Task]:
    """The docs' chunks, shortest first, in tasks of at most ``task_chunks``.

    Sorting by length keeps a task's texts alike in length, so the model
    pads each of its batches little.
    """
    pieces = [(doc.id, number, text) for doc in docs for number, text in enumerate(chunks(doc.text, chunk_chars))]
    pieces.sort(key=lambda piece: len(piece[2]))
    size = max(1, min(task_chunks, math.ceil(len(pieces) / (TASKS_PER_WORKER * workers))))
    return [Task(collection, [p[0] for p in batch], [p[1] for p in batch], [p[2] for p in batch])
            for batch in (pieces[i:i + size] for i in range(0, len(pieces), size))]


def enqueue(client: workq.QueueClient, run: Run, tasks: list[Task], advance: Callable[[int], None]) -> None:
    """Enqueue every task, durably: once this returns the producer could walk away."""
    for i in range(0, len(tasks), ENQUEUE_TASKS):
        group = tasks[i:i + ENQUEUE_TASKS]
        client.enqueue(run.job, MODEL, SHAPE, run.lane, [t.encode() for t in group], durable=True)
        advance(len(group))


def collect(client: workq.QueueClient, run: Run, tasks: list[Task], workers: list[Any],
            advance: Callable[[int], None]) -> dict[int, list[int]]:
    """doc id -> refs in chunk order, from every task's result.

    workq hands each result out once; a chunk reported twice would be a bug
    (in the queue or here), so it is an error rather than overwritten.
    """
    expected = {(doc, chunk) for task in tasks for doc, chunk in zip(task.ids, task.chunks)}
    found: dict[tuple[int, int], int] = {}
    received = 0
    while received < len(tasks):
        for result in client.results(run.job, max_items=1000, wait=0.5):
            received += 1
            for doc, chunk, ref in decode_result(result.payload):
                if (doc, chunk) in found or (doc, chunk) not in expected:
                    raise click.ClickException(f"result {result.handle} reports chunk {chunk} of doc {doc} again")
                found[(doc, chunk)] = ref
            advance(1)
        alive = [p for p in workers if p.is_alive()]
        if not alive:
            raise click.ClickException(f"every worker exited (codes {[p.exitcode for p in workers]}) "
                                       f"with {len(tasks) - received} tasks left; see their errors above")
    refs: dict[int, list[int]] = {}
    for (doc, _chunk), ref in sorted(found.items()):
        refs.setdefault(doc, []).append(ref)
    return refs


def start_workers(run: Run) -> tuple[list[Any], Any, Any]:
    """(processes, stop event, stats queue): ``run.workers`` processes of embed_worker.work."""
    # spawn: a fresh interpreter per worker, not a fork of a process holding sockets and threads
    ctx = multiprocessing.get_context("spawn")
    stop, report = ctx.Event(), ctx.Queue()
    processes = [ctx.Process(target=work, args=(run.address, run.lane, stop, report), name=f"worker-{i}")
                 for i in range(run.workers)]
    for p in processes:
        p.start()
    return processes, stop, report


def stop_workers(processes: list[Any], stop: Any, report: Any) -> list[WorkerStats]:
    """Tell the workers to finish, and return the stats of those that reported."""
    stop.set()
    stats: list[WorkerStats] = []
    deadline = time.monotonic() + 30
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join()
    while not report.empty():
        stats.append(WorkerStats(**report.get()))
    return stats


def embed_corpus(run: Run, docs_from: Callable[[], list[Doc]], chunk_chars: int, task_chunks: int,
                 out: Path) -> None:
    """The whole run: workers, documents, tasks, results, refs file, summary."""
    with StoreClient(run.address, retry_for=CONNECT_S) as store, run.phase("connect"):
        try:
            info = store.create_collection(run.collection, DIM, METRIC)
        except Unavailable as exc:
            raise click.ClickException(f"{exc} (start one with `shardmgr serve`)") from exc
        if info["rows"]:
            raise click.ClickException(f"collection {run.collection!r} already holds {info['rows']} vectors: "
                                       "name a new one with --collection")
    processes, stop, report = start_workers(run)  # they load the model while the corpus is read
    try:
        with run.phase("read corpus"):
            docs = docs_from()
        if not docs:
            raise click.ClickException("no documents")
        with run.phase("plan tasks"):
            tasks = plan_tasks(run.collection, docs, chunk_chars, task_chunks, run.workers)
        console = Console(stderr=True)
        columns = (TextColumn("{task.description:<9}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with workq.connect(run.address) as client, Progress(*columns, console=console) as progress:
            queued = progress.add_task("enqueued", total=len(tasks))
            done = progress.add_task("embedded", total=len(tasks))
            pipeline_started = time.perf_counter()
            with run.phase("enqueue"):
                enqueue(client, run, tasks, lambda n: progress.advance(queued, n))
            with run.phase("collect"):
                refs = collect(client, run, tasks, processes, lambda n: progress.advance(done, n))
            pipeline_s = time.perf_counter() - pipeline_started
    finally:
        with run.phase("stop workers"):
            stats = stop_workers(processes, stop, report)
    with run.phase("write refs"):
        header = {"collection": run.collection, "model": MODEL, "dim": DIM, "metric": METRIC, "job": run.job,
                  "chunk_chars": chunk_chars, "docs": len(docs)}
        write_refs(out, header, docs, refs)
    summary(run, docs, tasks, stats, pipeline_s, out)


def summary(run: Run, docs: list[Doc], tasks: list[Task], stats: list[WorkerStats], pipeline_s: float,
            out: Path) -> None:
    """Print what was done, the time per phase and the throughput."""
    vectors = sum(len(t.ids) for t in tasks)
    total_s = time.perf_counter() - run.started
    click.echo(f"{len(docs)} documents, {vectors} vectors in {len(tasks)} tasks, {run.workers} workers, "
               f"collection {run.collection!r}, job {run.job!r}")
    click.echo(f"refs: {out}")
    for name, seconds in run.phases.items():
        click.echo(f"  {name:<14} {seconds:8.2f} s")
    click.echo(f"  {'total':<14} {total_s:8.2f} s")
    click.echo(f"enqueue to last result: {pipeline_s:.2f} s, {len(docs) / pipeline_s:,.0f} docs/s, "
               f"{vectors / pipeline_s:,.0f} vectors/s; end to end {len(docs) / total_s:,.0f} docs/s")
    for s in sorted(stats, key=lambda s: s.worker):
        click.echo(f"  {s.worker}: {s.tasks} tasks, {s.vectors} vectors; model load {s.load_s:.2f} s, "
                   f"embed {s.embed_s:.2f} s, append {s.append_s:.2f} s, complete+lease {s.complete_s:.2f} s, "
                   f"idle {s.idle_s:.2f} s")


@click.command()
@click.option("--debian", is_flag=True, help="Documents: every package in `apt-cache dumpavail` (name: description).")
@click.option("--text", "text_file", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Documents: the paragraphs of a UTF-8 text file (blank lines separate them).")
@click.option("--address", default="127.0.0.1:7300", show_default=True, help="The shardmgr server.")
@click.option("--collection", default="docs", show_default=True, help="A new (or empty) collection to fill.")
@click.option("--workers", default=2, show_default=True, type=click.IntRange(1, 64), help="Worker processes.")
@click.option("--chunk-chars", default=1000, show_default=True, type=click.IntRange(16),
              help="Longer documents are cut at whitespace into chunks of at most this many characters.")
@click.option("--task-chunks", default=256, show_default=True, type=click.IntRange(1), help="Chunks per task, at most.")
@click.option("--limit", type=click.IntRange(1), help="Only the first N documents.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path),
              help="The doc -> refs file  [default: <collection>.refs.jsonl]")
def main(debian: bool, text_file: Path | None, address: str, collection: str, workers: int, chunk_chars: int,
         task_chunks: int, limit: int | None, out: Path | None) -> None:
    """Embed documents with wordllama through workq workers into a shardmgr collection."""
    if debian == (text_file is not None):
        raise click.UsageError("give exactly one of --debian and --text FILE")

    def docs_from() -> list[Doc]:
        docs = debian_docs() if debian else paragraph_docs(text_file) if text_file else []
        return docs[:limit] if limit else docs

    run = Run(address, collection, workers)
    embed_corpus(run, docs_from, chunk_chars, task_chunks, out or Path(f"{collection}.refs.jsonl"))


if __name__ == "__main__":
    main()
