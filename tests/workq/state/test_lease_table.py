"""The lease table: expiry and memory under one-item-per-call leasing."""

from __future__ import annotations

from workq.state.lease_table import COMPACT_AFTER, LeaseTable


def test_leases_that_ended_early_do_not_pile_up_in_the_expiry_heap() -> None:
    table = LeaseTable()
    keep = [table.add(1, 7, "w", 100.0 + i, [10_000_000 + i]) for i in range(10)]  # stay leased
    for handle in range(5 * COMPACT_AFTER):  # leased and completed one at a time, each a lease of its own
        table.add(1, 7, "w", 50.0, [handle])
        table.remove([handle])
        assert table.heap_size <= 2 * COMPACT_AFTER + 2 * len(keep) + 2
    assert len(table) == len(keep)
    ended = table.expired(104.5)  # the live leases still expire, in deadline order
    assert [handles for _, handles in ended] == [[10_000_000 + i] for i in range(5)]
    assert len(table) == 5 and table.next_deadline() == 105.0


def test_a_touched_lease_expires_at_its_new_deadline_only() -> None:
    table = LeaseTable()
    table.add(1, 7, "w", 10.0, [1, 2, 3])
    table.extend([2], 20.0)
    assert sorted(h for _, hs in table.expired(15.0) for h in hs) == [1, 3]
    assert [hs for _, hs in table.expired(25.0)] == [[2]] and len(table) == 0


def test_leases_that_end_in_lease_order_leave_the_heap_at_once() -> None:
    table = LeaseTable()
    for handle in range(100):  # two in flight at a time, each completed in the order it was leased
        table.add(1, 7, "w", 50.0 + handle, [handle])
        if handle:
            table.remove([handle - 1])
        assert table.heap_size == len(table) == 1
    table.add(1, 7, "w", 10.0, [500])  # an earlier deadline, on top: the next ended one stays behind it
    table.remove([99])
    assert table.heap_size == 2 and len(table) == 1
    table.remove([500])
    assert table.heap_size == 0 and table.next_deadline() is None
