"""Invariants of a checkpoint's restored state, checked before a store is built from it.

`expected_counts` gives the counts that tie a checkpoint's parts together (per shard: write position,
live steps, live records, records ever made, holes, commits, live selector items; for the store:
capacity, shards, steps, global sequence), recorded in the checkpoint's manifest at save.
`check_state` tests the state `replay.checkpoint.load` read against them and against the episode
index's own invariants: array shapes, record ids strictly increasing (generations monotone), lengths
>= 0, runs of positions inside the ring's live range and disjoint, every live step stamped with a live
record that covers it, flags known, priorities finite and >= 0, counters >= 0. Nothing in a
checkpoint is trusted: a violation raises `replay.CheckpointError` naming the checkpoint and the array.
See docs/architecture.md#checkpoints.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from replay._files import CheckpointError
from replay.keys import MAX_POSITION, MAX_SHARDS
from replay.selector_state import EXHAUSTED as ITEM_EXHAUSTED
from replay.selector_state import LIVE
from replay.shard_layout import CONTINUATION, EXHAUSTED, OPEN, REC_FLAGS, REC_ID, REC_LENGTH, REC_START

__all__ = ["check_state", "expected_counts"]


def expected_counts(state: dict[str, Any]) -> dict[str, Any]:
    """The counts a checkpoint's manifest records, from the state `replay.checkpoint.save` writes."""
    config, table = state["config"], state["table"]
    shards = []
    for s, sh in enumerate(state["shards"]):
        items = sum(int(np.count_nonzero(p == LIVE)) for p in table["shards"][s]["state"])
        shards.append(
            {
                "write_pos": int(sh["write_pos"]),
                "live": sum(len(p) for p in sh["steps"]),
                "records": len(sh["records"]),
                "n_records": int(sh["n_records"]),
                "holes": int(sh["holes"]),
                "commits": int(sh["commits"]),
                "items": items,
            }
        )
    return {
        "capacity": int(config["capacity"]),
        "num_shards": int(config["num_shards"]),
        "steps": sum(s["write_pos"] for s in shards),
        "global_seq": int(state["control"]["global_seq"]),
        "shards": shards,
    }


def _fail(folder: str, what: str, message: str) -> None:
    raise CheckpointError(f"checkpoint {folder}: {what}: {message}", folder, (what,) if "/" in what else ())


def _count(folder: str, what: str, value: Any, lo: int = 0, hi: int = MAX_POSITION) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= int(value) <= hi:
        _fail(folder, what, f"{value!r} is not an integer in [{lo}, {hi}]")
    return int(value)


def check_state(folder: str, counts: dict[str, Any], state: dict[str, Any]) -> None:
    """Check ``state`` (from `replay.checkpoint.load`, index arrays read) against ``counts``.

    Raises
    ------
    CheckpointError
        A count that differs from the manifest's, an array of another shape or dtype, or an episode
        index, selector or counter invariant that does not hold.
    """
    config, control, table = state["config"], state["control"], state["table"]
    cap = _count(folder, "capacity", config["capacity"], 1)
    num = _count(folder, "num_shards", config["num_shards"], 1, MAX_SHARDS)
    if cap != counts["capacity"] or num != counts["num_shards"] or len(counts["shards"]) != num:
        _fail(folder, "zarr.json", f"capacity {cap} x {num} shards differ from the manifest's counts")
    if len(state["shards"]) != num or len(table["shards"]) != num:
        _fail(folder, "zarr.json", f"{len(state['shards'])} shard entries for {num} shards")
    gseq = _count(folder, "global_seq", control["global_seq"])
    if gseq != counts["global_seq"]:
        _fail(folder, "zarr.json", f"global sequence {gseq}, the manifest says {counts['global_seq']}")
    for name, v in control["counters"].items():
        _count(folder, f"counters.{name}", v)
    _count(folder, "writers", control["writers"])
    if len(control["assigned"]) != num:
        _fail(folder, "zarr.json", f"{len(control['assigned'])} shard loads for {num} shards")
    for v in control["assigned"]:
        _count(folder, "assigned", v)
    if sum(int(sh["write_pos"]) for sh in state["shards"]) != counts["steps"]:
        _fail(folder, "zarr.json", "the shards' write positions do not sum to the manifest's steps")
    if table.get("store_id") is not None:
        _count(folder, "store_id", table["store_id"], 0, 2**64 - 1)
    lineage = table.get("lineage", [])
    if not isinstance(lineage, list):
        _fail(folder, "zarr.json", f"lineage {lineage!r} is not a list of store ids")
    for v in lineage:
        _count(folder, "lineage", v, 0, 2**64 - 1)
    spec = config["spec"]
    for s in range(num):
        _check_shard(folder, s, cap, gseq, spec, counts["shards"][s], state["shards"][s], table["shards"][s])


def _check_shard(
    folder: str,
    s: int,
    cap: int,
    gseq: int,
    spec: dict[str, Any],
    want: dict[str, Any],
    sh: dict[str, Any],
    items: dict[str, Any],
) -> None:
    g = f"shard{s}"
    wp = _count(folder, f"{g} write_pos", sh["write_pos"], 0, MAX_POSITION - 1)
    live, floor = min(wp, cap), max(0, wp - cap)
    got = {k: int(sh[k]) for k in ("n_records", "holes", "commits")}
    got.update(write_pos=wp, live=live, records=len(sh["records"]))
    for k, v in got.items():
        if v != want[k]:
            _fail(folder, f"{g}/records", f"{k} is {v}, the manifest says {want[k]}")
    _count(folder, f"{g} holes", got["holes"], 0, wp)
    _count(folder, f"{g} commits", got["commits"], 0, wp + got["n_records"])
    for name, (shape, dtype, *codec) in spec.items():
        if codec:  # compressed chunks: checked against their checksums by `replay.checkpoint.load`
            continue  # (`replay.chunk_state.chunk_state_fault`), then decompressed by the ring's load_state
        arr = sh["columns"][name]
        if tuple(arr.shape) != (live, *shape) or np.dtype(arr.dtype) != np.dtype(dtype):
            _fail(folder, f"{g}/{name}", f"shape {arr.shape} {arr.dtype}, expected {(live, *shape)} {dtype}")
    steps, recs = sh["steps"], sh["records"]
    if steps.shape != (live, 3) or steps.dtype != np.int64:
        _fail(folder, f"{g}/steps", f"shape {steps.shape} {steps.dtype}, expected ({live}, 3) int64")
    if recs.ndim != 2 or recs.shape[1] != 4 or recs.dtype != np.int64 or len(recs) > live:
        _fail(folder, f"{g}/records", f"shape {recs.shape} {recs.dtype}, expected (<= {live}, 4) int64")
    ids, start, length = recs[:, REC_ID], recs[:, REC_START], recs[:, REC_LENGTH]
    if len(recs):
        if (ids < 0).any() or (ids >= got["n_records"]).any() or (np.diff(ids) <= 0).any():
            _fail(folder, f"{g}/records", f"record ids not strictly increasing in [0, {got['n_records']})")
        if len(np.unique(ids % cap)) != len(ids):
            _fail(folder, f"{g}/records", "two live records share a slot of the record ring")
        end = start + length
        if (length < 0).any() or (start < 0).any() or (end > wp).any() or (end <= floor).any():
            _fail(folder, f"{g}/records", f"a record's run of positions is not inside [{floor}, {wp})")
        if (end[:-1] > start[1:]).any():
            _fail(folder, f"{g}/records", "records' runs of positions overlap")
        if (recs[:, REC_FLAGS] & ~(OPEN | CONTINUATION)).any():
            _fail(folder, f"{g}/records", "unknown record flags")
    rid, seq, flags = steps[:, 0], steps[:, 1], steps[:, 2]
    stamped = rid >= 0
    bad_seq = (seq[stamped] < 0).any() or (seq[stamped] >= gseq).any()
    if (rid < -1).any() or (flags & ~EXHAUSTED).any() or bad_seq:
        _fail(folder, f"{g}/steps", "a step's record id, sequence number or flags is out of range")
    if stamped.any():
        at = np.searchsorted(ids, rid[stamped])
        pos = np.arange(floor, wp, dtype=np.int64)[stamped]
        ok = at < len(ids)
        ok[ok] = ids[at[ok]] == rid[stamped][ok]
        if not ok.all():
            _fail(folder, f"{g}/steps", "a live step names a record that is not in the checkpoint")
        if ((pos < start[at]) | (pos >= start[at] + length[at])).any():
            _fail(folder, f"{g}/steps", "a live step lies outside the run of its record")
    if np.count_nonzero(~stamped) > got["holes"]:
        _fail(folder, f"{g}/steps", f"more hole steps than the {got['holes']} holes the shard made")
    for name in ("priority", "times_sampled", "state"):
        if items[name].shape != (live,):
            _fail(folder, f"{g}/{name}", f"shape {items[name].shape}, expected ({live},)")
    p, t, st = items["priority"], items["times_sampled"], items["state"]
    if not np.isfinite(p).all() or (p < 0).any():
        _fail(folder, f"{g}/priority", "a priority is NaN, infinite or negative")
    if (t < 0).any():
        _fail(folder, f"{g}/times_sampled", "a use count is negative")
    if not np.isin(st, (0, LIVE, ITEM_EXHAUSTED)).all() or int(np.count_nonzero(st == LIVE)) != want["items"]:
        _fail(folder, f"{g}/state", f"unknown states, or not the manifest's {want['items']} live items")
