"""The tensor buffer pool: a buffer is used again only once every array over it has been freed."""

from __future__ import annotations

import gc

import numpy as np

from rknn_proto.buffers import MIN_POOLED_BYTES, BufferPool, KeptBytes

SIZE = 4 * MIN_POOLED_BYTES


def _address(array: np.ndarray) -> int:
    return int(array.ctypes.data)


def test_a_freed_buffer_takes_the_next_tensor_of_its_size() -> None:
    pool = BufferPool()
    first = pool.take(SIZE)
    where = _address(first)
    del first
    again = pool.take(SIZE)
    assert _address(again) == where
    assert again.flags.writeable and again.nbytes == SIZE and again.dtype == np.uint8


def test_a_buffer_is_never_handed_out_while_a_view_of_it_lives() -> None:
    pool = BufferPool()
    first = pool.take(SIZE)
    first[:] = 7
    where = _address(first)
    view = first.view(np.float32).reshape(4, -1)[1:]  # any view keeps the buffer held
    del first
    gc.collect()
    other = pool.take(SIZE)
    other[:] = 0
    assert _address(other) != where
    assert (view.view(np.uint8) == 7).all()
    del view
    assert _address(pool.take(SIZE)) == where  # back once the last view went


def test_small_buffers_are_not_pooled_and_only_same_sizes_are_reused() -> None:
    pool = BufferPool()
    small = pool.take(MIN_POOLED_BYTES - 1)
    assert small.base is None  # a plain np.empty
    big = pool.take(SIZE)
    where = _address(big)
    del big
    assert _address(pool.take(2 * SIZE)) != where


def test_the_pool_keeps_no_more_than_its_bound_of_unheld_buffers() -> None:
    pool = BufferPool(keep_bytes=SIZE)
    first, second = pool.take(SIZE), pool.take(SIZE)
    kept, dropped = _address(first), _address(second)
    del first, second  # the first back is kept, the second goes back to the system
    third, fourth = pool.take(SIZE), pool.take(SIZE)
    assert _address(third) == kept
    assert _address(fourth) != kept
    assert dropped != kept


def test_all_pools_together_keep_no_more_than_the_process_bound() -> None:
    kept = KeptBytes(limit=2 * SIZE)  # a process whose pools may keep two buffers in all
    pools = [BufferPool(kept=kept) for _ in range(3)]
    held = [pool.take(SIZE) for pool in pools]
    del held  # three come back: two are kept, the third goes back to the system
    assert kept.bytes == 2 * SIZE
    assert sum(len(stores) for pool in pools for stores in pool._spare.values()) == 2
    again = [pool.take(SIZE) for pool in pools]
    assert kept.bytes == 0  # both kept ones are out again
    del again
    assert kept.bytes == 2 * SIZE
    del pools  # pools that go take what they kept off the process's count
    gc.collect()
    assert kept.bytes == 0
