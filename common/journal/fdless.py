"""Read-only mappings that keep no file descriptor.

CPython's ``mmap.mmap`` (before 3.13's ``trackfd=False``) keeps a duplicate
of the file's descriptor for as long as the mapping lives, so a process that
maps many files holds a descriptor per mapping, however idle the files are.
``map_readonly`` maps a whole file with the C library's ``mmap`` instead:
the kernel keeps the file alive through the mapping alone, and the
descriptor it was made from can be closed at once. The mapping is unmapped
when the last numpy array (or memoryview) reading it is gone.

Linux and other POSIX systems with ``mmap`` in the C library.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import weakref

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.restype = ctypes.c_int
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
MAP_FAILED = ctypes.c_void_p(-1).value


def map_readonly(fd: int, size: int) -> ctypes.Array[ctypes.c_char]:
    """The first ``size`` (> 0) bytes of ``fd``'s file, mapped shared and
    read-only, as a ctypes buffer (numpy reads it in place with
    ``np.frombuffer``). The caller may close ``fd`` at once."""
    if size <= 0:
        raise ValueError(f"cannot map {size} bytes")
    address = _libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
    if address is None or address == MAP_FAILED:
        error = ctypes.get_errno()
        raise OSError(error, f"mmap of {size} bytes failed: {os.strerror(error)}")
    buffer = (ctypes.c_char * size).from_address(address)
    weakref.finalize(buffer, _libc.munmap, address, size)  # when no array reads it any more
    return buffer
