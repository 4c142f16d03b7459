"""The int64 words of a replay shard's index region, by name (shared by `replay.shard`, which reads
and writes them in Python, and `replay.commit_kernel`, which commits to them in compiled code).

A shard's index region is: the shard mutex (`replay._sync.SLOT_BYTES`), ``META_LEN`` meta words, then
three words per step slot (its episode record id, commit sequence number, flags) and four per episode record
(`REC_ID`, `REC_START`, `REC_LENGTH`, `REC_FLAGS`).

>>> from replay.shard_layout import WRITE_POS, OPEN
"""

from __future__ import annotations

__all__ = [
    "COMMITS",
    "CONTINUATION",
    "EXHAUSTED",
    "HOLES",
    "HOLE_END",
    "LOST_RECORD",
    "META_LEN",
    "N_RECORDS",
    "OPEN",
    "OWNER_SHIFT",
    "REC_FLAGS",
    "REC_ID",
    "REC_LENGTH",
    "REC_START",
    "RESERVE_DELETES",
    "RESERVE_POS",
    "WRITE_POS",
]

# meta words. RESERVE_DELETES: the items the commit in progress overwrites, stored before RESERVE_POS
# publishes its reservation and cleared after WRITE_POS publishes the steps; a repair of that commit
# (its writer died between the two) counts them as deleted. HOLE_END: the position after the newest
# hole (0: none), so that a ring whose floor has passed it is known to hold no hole.
WRITE_POS, RESERVE_POS, N_RECORDS, HOLES, COMMITS, RESERVE_DELETES, HOLE_END = 0, 1, 2, 3, 4, 5, 6
META_LEN = 16  # meta words reserved (the rest are zero)
# a record's words and its flags
REC_ID, REC_START, REC_LENGTH, REC_FLAGS = 0, 1, 2, 3
OPEN, CONTINUATION = 1, 2
OWNER_SHIFT = 8  # a record's flags from this bit up: the pid of the writer that opened it (0: unknown)
LOST_RECORD = 1 << 62  # no record has this id (ids count up from 0): a commit to it starts a continuation
# a step's flags
EXHAUSTED = 1  # sampled max_times_sampled times
