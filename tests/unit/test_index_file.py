"""IndexFile / IndexService: layout, chains, time ranges, rolling, retention, recovery, determinism."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import mmh3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.store.index_file import RESERVE_ENTRIES, IndexFile
from broker.store.index_layout import (
    DEFAULT_INDEX_NUM,
    DEFAULT_SLOT_NUM,
    ENTRY,
    ENTRY_SIZE,
    HEADER,
    HEADER_SIZE,
    SLOT_SIZE,
    IndexFileCorrupt,
    IndexHeader,
    geometry_of,
    index_file_name,
    index_file_size,
    key_hash,
)
from broker.store.index_service import IndexService
from tests.support.tmpfs import require_mount, tmpfs

T0 = 1_700_000_000_000  # a store time in ms
COLLIDING = ("k15599", "k97211")  # different keys, same 31-bit hash
BIG = 1 << 62


def snapshot(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def index(tmp_path: Path) -> Iterator[IndexFile]:
    f = IndexFile.create(tmp_path / "idx", 64, 256)
    yield f
    f.close()


def test_key_hash_and_collision_pair() -> None:
    assert key_hash("order-1") == mmh3.hash("order-1", signed=False) & 0x7FFFFFFF
    assert 0 <= key_hash("x") < 1 << 31
    assert key_hash(COLLIDING[0]) == key_hash(COLLIDING[1])


def test_create_is_zeros_but_for_the_geometry_stamp(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 8, 16)
    raw = (tmp_path / "idx").read_bytes()
    assert len(raw) == index_file_size(8, 16) == HEADER_SIZE + 8 * SLOT_SIZE + 16 * ENTRY_SIZE
    stamp_at = HEADER_SIZE + 8 * SLOT_SIZE
    assert raw[:stamp_at] == bytes(stamp_at)
    stamp = b"RMQI" + (8).to_bytes(4, "big") + (16).to_bytes(4, "big") + bytes(8)
    assert raw[stamp_at:stamp_at + ENTRY_SIZE] == stamp
    assert raw[stamp_at + ENTRY_SIZE:] == bytes(15 * ENTRY_SIZE)
    assert f.header() == IndexHeader(0, 0, 0, 0, 0, 0)
    assert (f.capacity, f.free, f.is_full) == (15, 15, False)
    with pytest.raises(FileExistsError):
        IndexFile.create(tmp_path / "idx", 8, 16)
    with pytest.raises(ValueError):
        IndexFile.create(tmp_path / "other", 8, 1)
    f.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]


def test_put_layout(index: IndexFile, tmp_path: Path) -> None:
    assert index.put("a", 100, T0 + 300)
    assert index.put("b", 200, T0 + 2_500)
    raw = (tmp_path / "idx").read_bytes()
    assert HEADER.unpack(raw[:HEADER_SIZE]) == (T0 + 300, T0 + 2_500, 100, 200, 2, 2)
    entries = HEADER_SIZE + 64 * SLOT_SIZE
    assert ENTRY.unpack(raw[entries + ENTRY_SIZE:entries + 2 * ENTRY_SIZE]) == (key_hash("a"), 100, 0, 0)
    assert ENTRY.unpack(raw[entries + 2 * ENTRY_SIZE:entries + 3 * ENTRY_SIZE]) == (key_hash("b"), 200, 2, 0)
    slot_a = HEADER_SIZE + key_hash("a") % 64 * SLOT_SIZE
    assert raw[slot_a:slot_a + 4] == (1).to_bytes(4, "big")
    assert index.header() == IndexHeader(T0 + 300, T0 + 2_500, 100, 200, 2, 2)


def test_round_trip_and_reopen(index: IndexFile, tmp_path: Path) -> None:
    for i in range(100):
        assert index.put(f"key-{i % 30}", 1000 * i, T0 + 10 * i)
    expected = {k: [1000 * i for i in reversed(range(100)) if f"key-{i % 30}" == k]
                for k in (f"key-{j}" for j in range(30))}
    for k, positions in expected.items():
        assert index.query(k, 0, BIG, 100) == positions
    assert index.query("absent", 0, BIG, 100) == []
    index.flush()
    index.close()
    again = IndexFile.open(tmp_path / "idx", 64, 256)
    slots_used = len({key_hash(f"key-{j}") % 64 for j in range(30)})
    assert again.header() == IndexHeader(T0, T0 + 990, 0, 99_000, slots_used, 100)
    for k, positions in expected.items():
        assert again.query(k, 0, BIG, 100) == positions
    again.close()


def test_colliding_keys_in_few_slots_are_all_found(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 2, 200)
    for i in range(150):
        assert f.put(f"k{i}", i, T0 + i)
    assert f.header().hash_slot_count == 2
    for i in range(150):
        assert f.query(f"k{i}", 0, BIG, 10) == [i]  # walks a chain of about 75 entries
    f.close()


def test_same_hash_different_keys_both_returned(index: IndexFile) -> None:
    a, b = COLLIDING
    index.put(a, 1, T0)
    index.put(b, 2, T0)
    index.put("other", 3, T0)
    assert index.query(a, 0, BIG, 10) == [2, 1]  # the caller re-checks the real key
    assert index.query(b, 0, BIG, 10) == [2, 1]


def test_time_range_filtering(index: IndexFile) -> None:
    for i in range(10):
        index.put("k", i, T0 + 1000 * i)  # one per second
    assert index.query("k", T0 + 3000, T0 + 5999, 100) == [5, 4, 3]
    assert index.query("k", T0 + 3000, T0 + 3000, 100) == [3]
    assert index.query("k", T0 + 9001, BIG, 100) == [9]  # within the entry's one-second window
    assert index.query("k", T0 + 10_000, BIG, 100) == []
    assert index.query("k", 0, T0 - 1, 100) == []
    assert index.query("k", T0 + 5000, T0 + 3000, 100) == []


def test_time_window_is_seconds_floored(index: IndexFile) -> None:
    index.put("k", 1, T0)
    index.put("k", 2, T0 + 1_700)  # time_diff 1: window [T0 + 1000, T0 + 1999]
    assert index.query("k", T0 + 1_100, T0 + 1_200, 10) == [2]  # really at 1_700: within 999 ms
    assert index.query("k", T0 + 2_000, T0 + 3_000, 10) == []
    index.put("k", 3, T0 - 600)  # a store time going back: time_diff -1, window [T0 - 1000, T0 - 1]
    assert index.query("k", T0 - 900, T0 - 800, 10) == [3]
    assert index.query("k", T0 - 5_000, T0 + 5_000, 10) == [3, 2, 1]
    assert (index.header().begin_timestamp, index.header().end_timestamp) == (T0, T0 + 1_700)


def test_max_results(index: IndexFile) -> None:
    for i in range(20):
        index.put("k", i, T0)
    assert index.query("k", 0, BIG, 5) == [19, 18, 17, 16, 15]
    with pytest.raises(ValueError):
        index.query("k", 0, BIG, 0)


def test_full_file_returns_false(tmp_path: Path) -> None:
    f = IndexFile.create(tmp_path / "idx", 4, 6)
    for i in range(5):
        assert f.put(f"k{i}", i, T0)
    before = (tmp_path / "idx").read_bytes()
    assert f.is_full and f.free == 0
    assert not f.put("k9", 9, T0)
    assert (tmp_path / "idx").read_bytes() == before
    assert f.header().index_count == 5
    f.close()


def test_open_checks_geometry(tmp_path: Path) -> None:
    IndexFile.create(tmp_path / "idx", 64, 256).close()
    with pytest.raises(IndexFileCorrupt, match="bytes"):
        IndexFile.open(tmp_path / "idx", 64, 255)
    with pytest.raises(IndexFileCorrupt, match="stamp"):
        IndexFile.open(tmp_path / "idx", 69, 255)  # 4 * 69 + 20 * 255 == 4 * 64 + 20 * 256
    IndexFile.open(tmp_path / "idx", 64, 256).close()


def test_closed(index: IndexFile) -> None:
    index.close()
    with pytest.raises(ValueError, match="closed"):
        index.put("k", 1, T0)
    index.close()


# -- IndexService -----------------------------------------------------------------------------

def service(directory: Path) -> IndexService:
    return IndexService(directory, slot_num=16, index_num=9, graded=False)  # 8 entries a file


def test_service_rolls_and_queries_newest_first(tmp_path: Path) -> None:
    s = service(tmp_path / "index")
    assert s.query("k", 0, BIG, 10) == []
    assert [p.name for p in (tmp_path / "index").iterdir()] == []
    for i in range(20):
        assert s.put_keys(["k", f"u{i}"], 100 * i, T0 + 1000 * i) == 2
    names = sorted(p.name for p in (tmp_path / "index").iterdir())
    assert names == [index_file_name(n) for n in range(5)]
    assert s.query("k", 0, BIG, 100) == [100 * i for i in reversed(range(20))]
    assert s.query("k", 0, BIG, 7) == [1900, 1800, 1700, 1600, 1500, 1400, 1300]
    assert s.query("k", T0 + 5000, T0 + 9999, 100) == [900, 800, 700, 600, 500]
    assert s.query("u3", 0, BIG, 100) == [300]
    files = s.files()
    assert [seq for seq, _ in files] == [0, 1, 2, 3, 4]
    assert files[1][1] == IndexHeader(T0 + 4000, T0 + 7000, 400, 700, files[1][1].hash_slot_count, 8)
    s.flush()
    s.close()
    again = service(tmp_path / "index")
    assert again.query("k", 0, BIG, 100) == [100 * i for i in reversed(range(20))]
    assert again.query("k", T0 + 5000, T0 + 9999, 100) == [900, 800, 700, 600, 500]
    again.put_keys(["k"], 2000, T0 + 20_000)
    assert again.query("k", 0, BIG, 2) == [2000, 1900]
    again.close()


def test_service_skips_files_out_of_the_time_range(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s = service(tmp_path / "index")
    for i in range(16):
        s.put_keys(["k"], i, T0 + 1000 * i)
    queried = []
    real = IndexFile.query

    def spy(self: IndexFile, *args: object) -> list[int]:
        queried.append(self.path.name)
        return real(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(IndexFile, "query", spy)
    assert s.query("k", T0 + 9000, T0 + 9000, 10) == [9]
    assert queried == [index_file_name(1)]
    s.close()


def test_message_keys_never_span_files(tmp_path: Path) -> None:
    s = service(tmp_path / "index")
    s.put_keys(["a", "b", "c", "d", "e"], 1, T0)
    assert s.put_keys(["f", "g", "h", "i"], 2, T0) == 4  # 3 left: a new file takes all four
    assert [h.index_count for _, h in s.files()] == [5, 4]
    assert s.put_keys(["x", "", "x", "y"], 3, T0) == 2  # empty skipped, repeats once
    assert s.put_keys([], 4, T0) == 0
    with pytest.raises(ValueError, match="more than an index file holds"):
        s.put_keys([f"k{i}" for i in range(9)], 5, T0)
    s.close()


def test_service_directories_are_byte_identical(tmp_path: Path) -> None:
    def build(d: Path, reopen_every: int) -> None:
        s = service(d)
        for i in range(40):
            s.put_keys([f"order-{i % 7}", f"id-{i}"], 64 * i, T0 + 250 * i)
            if (i + 1) % reopen_every == 0:
                s.flush()
                s.close()
                s = service(d)
        s.close()

    build(tmp_path / "a", 1000)
    build(tmp_path / "b", 3)
    assert snapshot(tmp_path / "a") == snapshot(tmp_path / "b")


def test_delete_before_position(tmp_path: Path) -> None:
    s = service(tmp_path / "index")
    for i in range(30):
        s.put_keys(["k", f"u{i}"], 100 * i, T0 + i)  # 4 messages a file: 0-300, 400-700, ...
    assert s.delete_before_position(300) == []
    assert s.delete_before_position(800) == [0, 1]
    assert sorted(p.name for p in (tmp_path / "index").iterdir())[0] == index_file_name(2)
    assert s.query("k", 0, BIG, 100) == [100 * i for i in reversed(range(8, 30))]
    assert s.delete_before_position(10**9) == [2, 3, 4, 5, 6]  # never the last file
    s.put_keys(["k"], 3000, T0 + 30)
    assert [seq for seq, _ in s.files()] == [7]
    s.flush()
    s.close()
    again = service(tmp_path / "index")
    assert again.query("k", 0, BIG, 100) == [3000, 2900, 2800]
    again.put_keys(["a", "b", "c", "d", "e", "f"], 3100, T0)
    assert [seq for seq, _ in again.files()] == [7, 8]
    again.close()


def test_truncate_from_position_then_redo_is_byte_identical(tmp_path: Path) -> None:
    messages = [([f"order-{i % 5}", f"id-{i}"] + (["x"] if i % 3 == 0 else []), 100 * i, T0 + 300 * i)
                for i in range(25)]
    clean = service(tmp_path / "clean")
    for m in messages:
        clean.put_keys(*m)
    clean.close()
    s = service(tmp_path / "crashed")
    for m in messages[:17]:
        s.put_keys(*m)
    restart = s.truncate_from_position(1150)  # keys from 1200 on may be lost
    assert restart <= 1200
    assert all(h.end_position < restart or h.index_count == 0 for _, h in s.files())
    for m in messages:
        if m[1] >= restart:
            s.put_keys(*m)
    s.close()
    assert snapshot(tmp_path / "crashed") == snapshot(tmp_path / "clean")
    s = service(tmp_path / "crashed")
    assert s.truncate_from_position(10**9) == 10**9  # nothing at or after: nothing to redo
    s.close()


def test_leftover_temp_file_removed_and_gaps_rejected(tmp_path: Path) -> None:
    d = tmp_path / "index"
    s = service(d)
    s.put_keys(["k"], 1, T0)
    s.close()
    (d / f".{index_file_name(1)}.tmp").write_bytes(b"partial")
    service(d).close()
    assert sorted(p.name for p in d.iterdir()) == [index_file_name(0)]
    IndexFile.create(d / index_file_name(2), 16, 9).close()
    with pytest.raises(IndexFileCorrupt, match="contiguous"):
        service(d)
    (d / index_file_name(2)).unlink()
    with pytest.raises(IndexFileCorrupt):
        IndexService(d, slot_num=16, index_num=10, graded=False)


# -- property ---------------------------------------------------------------------------------

KEYS = st.sampled_from(["a", "b", "c", "d", "e", "f", COLLIDING[0], COLLIDING[1]])


@settings(max_examples=150, deadline=None)
@given(puts=st.lists(st.tuples(KEYS, st.integers(0, 1 << 40), st.integers(-20_000, 60_000)),
                     min_size=1, max_size=40, unique_by=lambda put: put[1]),
       query_key=KEYS, lo=st.integers(-25, 65), width=st.integers(0, 90),
       ms=st.tuples(st.integers(-30_000, 70_000), st.integers(0, 80_000)),
       max_results=st.integers(1, 50))
def test_query_returns_exactly_the_matching_puts(puts: list[tuple[str, int, int]], query_key: str,
                                                 lo: int, width: int, ms: tuple[int, int],
                                                 max_results: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        f = IndexFile.create(Path(d) / "idx", 3, 64)  # 3 slots: long, shared chains
        for key, position, ts in puts:
            assert f.put(key, position, T0 + ts)
        begin = T0 + puts[0][2]
        h = key_hash(query_key)
        candidates = [(p, T0 + ts) for k, p, ts in reversed(puts) if key_hash(k) == h]  # newest first

        # Bounds on whole seconds from begin_timestamp: exactly the puts in range.
        b, e = begin + 1000 * lo, begin + 1000 * (lo + width) + 999
        expected = [p for p, ts in candidates if b <= ts <= e]
        assert f.query(query_key, b, e, max_results) == expected[:max_results]

        # Any bounds: every put in range is found, nothing more than 999 ms outside it, newest first.
        b, e = T0 + ms[0], T0 + ms[0] + ms[1]
        got = f.query(query_key, b, e, 1000)
        assert {p for p, ts in candidates if b <= ts <= e} <= set(got)
        assert set(got) <= {p for p, ts in candidates if b - 999 <= ts <= e + 999}
        assert got == [p for p, _ in candidates if p in set(got)]
        f.close()


def test_rollback_to_a_mark_restores_the_exact_bytes(tmp_path: Path) -> None:
    import filecmp
    import shutil

    svc = IndexService(tmp_path / "idx", slot_num=4, index_num=16, graded=False)
    for i in range(20):
        svc.put_keys([f"k{i % 5}", f"id{i}"], 100 * i, 1_000_000 + 37 * i)
    svc.flush()
    mark = svc.mark()
    shutil.copytree(tmp_path / "idx", tmp_path / "at-mark")
    for i in range(20, 45):  # more puts, rolling into new files
        svc.put_keys([f"k{i % 5}", f"id{i}"], 100 * i, 1_000_000 + 37 * i)
    svc.rollback(mark)
    svc.flush()
    names = sorted(p.name for p in (tmp_path / "idx").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "at-mark").iterdir())
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "idx", tmp_path / "at-mark", names, shallow=False)
    assert not mismatch and not errors
    assert svc.query("k3", 0, 2**62, 100) == [100 * i for i in (18, 13, 8, 3)]
    svc.close()


def test_put_many_is_all_or_nothing_and_equals_single_puts(tmp_path: Path) -> None:
    single = IndexFile.create(tmp_path / "single", 4, 6)
    for key in ("a", "b", "c"):
        assert single.put(key, 7, T0)
    many = IndexFile.create(tmp_path / "many", 4, 6)
    assert many.put_many(["a", "b", "c"], 7, T0)
    assert (tmp_path / "single").read_bytes() == (tmp_path / "many").read_bytes()
    before = (tmp_path / "many").read_bytes()
    assert not many.put_many(["d", "e", "f"], 8, T0)  # two fit, three do not: none is put
    assert (tmp_path / "many").read_bytes() == before and many.header().index_count == 3
    assert many.put_many(["d", "e"], 8, T0) and many.is_full
    single.close()
    many.close()


def test_puts_are_in_the_file_for_another_reader_before_any_flush(index: IndexFile, tmp_path: Path) -> None:
    index.put("k", 99, T0)  # stored through the mapping: the page cache is shared
    other = IndexFile.open(tmp_path / "idx", 64, 256)
    assert other.query("k", T0, T0, 5) == [99] and other.header().index_count == 1
    other.close()


def test_an_idle_index_is_small_and_files_grow_with_the_load(tmp_path: Path) -> None:
    svc = IndexService(tmp_path / "idx")  # the broker's defaults: 5M slots, 20M entries
    svc.put_keys(["k"], 0, T0)
    (first,) = (tmp_path / "idx").iterdir()
    assert first.stat().st_size == index_file_size(*geometry_of(0, DEFAULT_SLOT_NUM, DEFAULT_INDEX_NUM))
    assert first.stat().st_size < 7_000_000  # not the ~420 MB of a full file
    svc.close()
    assert [geometry_of(n, 64, 256) for n in range(5)] == [(1, 4), (4, 16), (16, 64), (64, 256), (64, 256)]
    small = IndexService(tmp_path / "small", slot_num=64, index_num=256)
    for i in range(60):  # 3 + 15 + 63 entries fill files 0..2; a 7-key message skips a full one
        small.put_keys([f"k{i}", f"x{i}"] if i % 10 else [f"k{i}", *(f"y{i}.{j}" for j in range(6))],
                       i, T0 + i)
    sizes = [geometry_of(seq, 64, 256)[1] for seq, _ in small.files()]
    assert sizes == sorted(sizes) and sizes[-1] == 256
    assert small.query("k42", 0, BIG, 5) == [42] and small.query("y50.5", 0, BIG, 5) == [50]
    small.close()
    again = IndexService(tmp_path / "small", slot_num=64, index_num=256)  # reopened by their grades
    assert again.query("x59", 0, BIG, 5) == [59]
    again.close()


def test_a_records_keys_put_at_once_give_the_bytes_of_putting_them_one_by_one(tmp_path: Path) -> None:
    """IndexService.put_messages (a record's messages, one write when they fit the last file)
    leaves the same files as put_keys per message, also where a record crosses into a new file."""
    from broker.store.index_service import IndexService

    batched, single = IndexService(tmp_path / "b", 8, 64), IndexService(tmp_path / "s", 8, 64)
    try:
        position = 4096
        for record in range(12):
            messages = [((f"k{record}-{i}", f"id{record}-{i}", ""), position + i)
                        for i in range(record % 5 + 1)]
            batched.put_messages(messages, 1_700_000_000_000 + record)
            for keys, at in messages:
                single.put_keys(keys, at, 1_700_000_000_000 + record)
            position += 500
        assert len(batched.files()) > 1
        batched.flush()
        single.flush()
        for a, b in zip(sorted((tmp_path / "b").iterdir()), sorted((tmp_path / "s").iterdir()), strict=True):
            assert a.name == b.name and a.read_bytes() == b.read_bytes()
    finally:
        batched.close()
        single.close()


@pytest.mark.parametrize("put", ["put", "put_pairs"])
def test_a_put_allocates_the_pages_it_will_store_into_first(tmp_path: Path, put: str) -> None:
    """Header, slots and the entries ahead are allocated before a put (of one key, or of a
    record's keys) stores into the mapping (``RESERVE_ENTRIES``); a file nobody put to stays
    sparse."""
    slots, entries = 4096, 1 << 17
    f = IndexFile.create(tmp_path / "idx", slots, entries)
    try:
        sparse = os.stat(f.path).st_blocks * 512
        if put == "put":
            f.put("order-1", 0, T0)
        else:
            assert f.put_pairs([("order-1", 0), ("id-1", 0)], T0)
        allocated = os.stat(f.path).st_blocks * 512
        reserved = HEADER_SIZE + slots * SLOT_SIZE + (RESERVE_ENTRIES + 2) * ENTRY_SIZE
        assert sparse < 64 << 10 and allocated >= reserved
        assert allocated < index_file_size(slots, entries) // 2  # not the whole file at once
    finally:
        f.close()


_FILL_THEN_PUT = """
import errno, sys
from pathlib import Path
from broker.store.index_file import IndexFile
disk = Path(sys.argv[1])
f = IndexFile.create(disk / "idx", 1024, 200_000)  # 4 MB apparent, sparse
filler = open(disk / "filler", "wb")
try:
    while True:
        filler.write(bytes(64 << 10)); filler.flush()
except OSError:
    pass
try:
    for i in range(0, 200_000, 4):
        if sys.argv[2] == "put":
            f.put(f"key-{i}", i * 64, 1_700_000_000_000)
        else:  # a record's keys
            f.put_pairs([(f"key-{i + k}", i * 64 + k) for k in range(4)], 1_700_000_000_000)
except OSError as e:
    print("refused", errno.errorcode[e.errno], f.header().index_count, flush=True)
filler.close()
(disk / "filler").unlink()
f.put("after-room", 1 << 30, 1_700_000_000_000)
print("put after room", f.header().index_count)
"""


@pytest.mark.parametrize("put", ["put", "put_pairs"])
def test_a_full_disk_refuses_a_put_instead_of_ending_the_process(tmp_path: Path, put: str) -> None:
    """On a full tmpfs, a store into an unallocated page of the mapping ends the process with
    SIGBUS: run in a child process, a put (of one key, or of a record's keys) must instead
    raise ENOSPC having written nothing, and succeed once there is room."""
    require_mount()
    with tmpfs(tmp_path / "disk", 1 << 20) as disk:
        done = subprocess.run([sys.executable, "-c", _FILL_THEN_PUT, str(disk.path), put],
                              capture_output=True, text=True, timeout=60,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert done.returncode == 0, f"the child died (signal {-done.returncode}): {done.stderr[-2000:]}"
    refused, after = done.stdout.splitlines()
    assert refused.startswith("refused ENOSPC ")
    count = int(refused.split()[-1])
    assert after == f"put after room {count + 1}"


def test_a_records_keys_that_find_the_disk_full_are_put_again_whole(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """IndexService.put_messages writes a record's keys or none of them: when the disk refuses
    the new file (or its pages) part-way through a record, the keys already put are taken
    back, so the apply step's retry leaves the bytes of a put that never failed."""
    import errno

    from broker.store import index_file

    calm, full = IndexService(tmp_path / "calm", 8, 64), IndexService(tmp_path / "full", 8, 64)
    real_create = index_file.IndexFile.create
    fail = {"next": False}

    def create_once_refused(*args: object, **kwargs: object) -> IndexFile:
        if fail["next"]:
            fail["next"] = False
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_create(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(index_file.IndexFile, "create", create_once_refused)
    try:
        refused = 0
        for record in range(30):
            messages = [((f"k{record}-{i}", f"id{record}-{i}"), 4096 * record + i)
                        for i in range(record % 7 + 1)]
            calm.put_messages(messages, T0 + record)
            fail["next"] = record % 3 == 0
            try:
                full.put_messages(messages, T0 + record)
            except OSError:
                refused += 1
                full.put_messages(messages, T0 + record)  # what written_once_there_is_room does
            fail["next"] = False
        assert refused and len(full.files()) > 3
        assert full.files() == calm.files()
        calm.flush()
        full.flush()
        pairs = zip(sorted((tmp_path / "calm").iterdir()), sorted((tmp_path / "full").iterdir()), strict=True)
        for a, b in pairs:
            assert a.name == b.name and a.read_bytes() == b.read_bytes()
    finally:
        calm.close()
        full.close()
