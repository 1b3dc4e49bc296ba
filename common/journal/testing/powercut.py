"""A power-cut simulator for files under one directory.

While installed, it wraps ``os.fsync`` and ``os.fdatasync``. When a sync of a
file under the root begins, it reads the file's bytes: that image is what the
sync makes durable. Bytes written by other threads while the image is being
read may or may not be in it, as with a real sync; a write whose ticket was
confirmed happened before its sync began, so it is always in the image. A
sync of a directory records its entries. A sync that raises records nothing.

:meth:`PowerCut.crash` then rewrites the files as a power cut could leave
them. The model:

* every 4 KiB page that differs from the last durable image keeps its old or
  its new content, independently, at random;
* at most one such page is torn: each of its 512-byte sectors is old or new
  at random (sector writes are assumed atomic, as on the disks we target);
* a file whose size changed since its last sync gets its old or new size;
* a file created (or renamed into place) after the last sync of its
  directory may vanish, and so may every file in a directory that was never
  synced; a file unlinked since then comes back with its last durable
  content. Directory listings follow the directory's inode, so a synced
  directory renamed into place keeps its entries (as on POSIX file systems);
* so do a directory's entries for its subdirectories: a subdirectory
  created (or renamed) under the root after the last sync of its parent may,
  at random, go back to where its parent's last synced listing had it (a
  rename undone), or, if no synced listing had it, vanish with everything
  in it. A directory removed since is not brought back (its files'
  structure is not recorded), nor is a rename undone whose old place is
  taken again; the root's own entry is outside the model.

Each page is restored to its last durable image or its current content;
states in between (a page written twice since the last sync, seen after the
first write) are not produced.

Threads writing to the files must be stopped before ``crash()`` (stop the
flusher with ``flush=False`` and abandon the journals).
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

PAGE = 4096
SECTOR = 512


@dataclasses.dataclass
class CutReport:
    """What a simulated power cut did."""

    files: int = 0
    pages_changed: int = 0
    pages_reverted: int = 0
    torn_page: tuple[str, int] | None = None
    resized: list[str] = dataclasses.field(default_factory=list)
    vanished: list[str] = dataclasses.field(default_factory=list)
    revived: list[str] = dataclasses.field(default_factory=list)
    moved_back: list[str] = dataclasses.field(default_factory=list)  # directories whose rename was undone


class PowerCut:
    """Install with ``with PowerCut(root, seed) as cut:`` and call ``cut.crash()``."""

    def __init__(self, root: str | Path, seed: int | None = None, tear: bool = True) -> None:
        self.root = Path(root).resolve()
        self.rng = random.Random(seed)
        self.tear = tear
        self._lock = threading.Lock()
        self._images: dict[int, bytes] = {}  # inode -> durable content
        self._listings: dict[int, dict[str, int]] = {}  # directory inode -> durable name -> inode
        self._subdirs: dict[int, dict[str, int]] = {}  # directory inode -> durable subdirectory name -> inode
        self._saved: tuple[Callable[[Any], None], Callable[[Any], None]] | None = None

    def __enter__(self) -> PowerCut:
        self.install()
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    def install(self) -> None:
        """Record the current state as durable and start watching syncs."""
        for directory, _, names in os.walk(self.root):
            inode = os.stat(directory).st_ino
            self._listings[inode], self._subdirs[inode] = self._list(Path(directory)), self._list_dirs(Path(directory))
            for name in names:
                self._images[os.stat(Path(directory) / name).st_ino] = (Path(directory) / name).read_bytes()
        self._saved = (os.fsync, os.fdatasync)
        real_fsync, real_fdatasync = self._saved

        def fsync(fd: Any) -> None:
            self._synced(fd, real_fsync)

        def fdatasync(fd: Any) -> None:
            self._synced(fd, real_fdatasync)

        os.fsync, os.fdatasync = fsync, fdatasync

    def uninstall(self) -> None:
        if self._saved is not None:
            os.fsync, os.fdatasync = self._saved  # type: ignore[assignment]
            self._saved = None

    def _synced(self, fd: Any, real: Callable[[Any], None]) -> None:
        fd = fd if isinstance(fd, int) else fd.fileno()
        try:
            path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            path = None
        if path is None or not path.is_relative_to(self.root):
            return real(fd)
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            listing, subdirs = self._list(path), self._list_dirs(path)
            real(fd)
            with self._lock:
                self._listings[info.st_ino] = listing  # by inode: a renamed directory keeps its entries
                self._subdirs[info.st_ino] = subdirs
            return None
        image = path.read_bytes()  # by path: the fd may be write-only
        real(fd)
        with self._lock:
            self._images[info.st_ino] = image
        return None

    @staticmethod
    def _list(directory: Path) -> dict[str, int]:
        return {e.name: e.inode() for e in os.scandir(directory) if e.is_file(follow_symlinks=False)}

    @staticmethod
    def _list_dirs(directory: Path) -> dict[str, int]:
        return {e.name: e.inode() for e in os.scandir(directory) if e.is_dir(follow_symlinks=False)}

    def crash(self) -> CutReport:
        """Rewrite every file (and directory entry) under the root as a power cut could leave it."""
        report = CutReport()
        with self._lock:
            self._crash_subdirectories(report)
            for directory in sorted(Path(d) for d, _, _ in os.walk(self.root)):
                self._crash_directory(directory, self._listings.get(directory.stat().st_ino, {}), report)
        return report

    def _crash_subdirectories(self, report: CutReport) -> None:
        """Undo, at random, subdirectory entries made since their parent's
        last sync, top down (an undone entry takes its subtree with it)."""
        places = {inode: (parent, name) for parent, names in self._subdirs.items() for name, inode in names.items()}
        pending: list[Path] = [self.root]
        seen: set[int] = set()
        while pending:
            directory = pending.pop()
            if directory.stat().st_ino in seen:
                continue
            seen.add(directory.stat().st_ino)
            durable = self._subdirs.get(directory.stat().st_ino, {})
            for name, inode in sorted(self._list_dirs(directory).items()):
                path = directory / name
                if durable.get(name) == inode or self.rng.random() >= 0.5:
                    pending.append(path)
                elif inode in places:  # renamed since: back to its synced place, if that is free
                    back = self._find_dir(places[inode][0])
                    if back is None or os.path.lexists(back / places[inode][1]):
                        pending.append(path)
                        continue
                    os.rename(path, back / places[inode][1])
                    pending.append(back / places[inode][1])
                    report.moved_back.append(str(path))
                else:  # never in a synced listing: gone, with everything in it
                    shutil.rmtree(path)
                    report.vanished.append(str(path))

    def _find_dir(self, inode: int) -> Path | None:
        """The directory under the root (or the root) with this inode now."""
        for directory, _, _ in os.walk(self.root):
            if os.stat(directory).st_ino == inode:
                return Path(directory)
        return None

    def _crash_directory(self, directory: Path, durable: dict[str, int], report: CutReport) -> None:
        current = self._list(directory)
        for name, inode in current.items():
            path = directory / name
            if durable.get(name) != inode and self.rng.random() < 0.5:
                path.unlink()
                report.vanished.append(str(path))
                continue
            self._crash_file(path, self._images.get(inode, b""), report)
        for name, inode in durable.items():
            if name not in current and inode in self._images:
                (directory / name).write_bytes(self._images[inode])
                report.revived.append(str(directory / name))

    def _crash_file(self, path: Path, old: bytes, report: CutReport) -> None:
        new = path.read_bytes()
        report.files += 1
        size = len(new)
        if len(old) != len(new):
            size = self.rng.choice((len(old), len(new)))
            report.resized.append(str(path))
        result = bytearray(size)
        changed: list[int] = []
        for start in range(0, size, PAGE):
            stop = min(start + PAGE, size)
            old_page, new_page = _page(old, start, stop), _page(new, start, stop)
            if old_page != new_page:
                changed.append(start)
                keep_new = self.rng.random() < 0.5
                report.pages_reverted += not keep_new
                new_page = new_page if keep_new else old_page
            result[start:stop] = new_page
        report.pages_changed += len(changed)
        if self.tear and changed and self.rng.random() < 0.5:
            start = self.rng.choice(changed)
            for sector in range(start, min(start + PAGE, size), SECTOR):
                stop = min(sector + SECTOR, size)
                source = new if self.rng.random() < 0.5 else old
                result[sector:stop] = _page(source, sector, stop)
            report.torn_page = (str(path), start)
        with open(path, "r+b") as f:
            f.truncate(size)
            f.seek(0)
            f.write(result)


def _page(data: bytes, start: int, stop: int) -> bytes:
    """data[start:stop], zero-filled where data is shorter."""
    chunk = data[start:stop]
    return chunk + bytes(stop - start - len(chunk))
