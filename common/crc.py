"""crc32c of a whole from the crc32c of its pieces (zlib's crc32_combine, for
crc32c): pieces checksummed apart, on several threads or as they arrive out
of order, give the checksum of their concatenation without reading the bytes
again. Used by ``verify --deep`` (shardmgr/verification/row_checksums.py) and
by the object store's checked downloads (shardmgr/cluster/state/objects.py)."""

from __future__ import annotations

POLY = 0x82F63B78  # crc32c's polynomial, bit-reflected


def combine(first: int, second: int, second_length: int) -> int:
    """crc32c(a + b) from crc32c(a), crc32c(b) and len(b)."""
    return _shift(first, second_length) ^ second


def _shift(crc: int, nbytes: int) -> int:
    """crc32c(a + zeros(n)) xor crc32c(zeros(n)) given crc32c(a): multiply by x^(8n) mod P."""
    return _gf2_multiply(crc, _x_power(8 * nbytes))


def _gf2_multiply(a: int, b: int) -> int:
    """a * b mod P in the reflected bit order crc32c uses."""
    product = 0
    m = 1 << 31
    while m:
        if a & m:
            product ^= b
        m >>= 1
        b = (b >> 1) ^ (POLY if b & 1 else 0)
    return product


def _x_power(n: int) -> int:
    """x^n mod P, reflected, by squaring."""
    result, square = 1 << 31, 1 << 30  # x^0 and x^1, reflected
    while n:
        if n & 1:
            result = _gf2_multiply(result, square)
        square = _gf2_multiply(square, square)
        n >>= 1
    return result
