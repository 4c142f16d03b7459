"""Ray actors against torch.distributed.rpc for the partition owners' requests (issue 31's engine choice).

Two processes on this machine: the caller and one server (a Ray actor, or rank 1 of an RPC group with
the TensorPipe backend). Cases, each the median of ``--repeats`` calls:

- ``empty``: a call with no payload (the round trip alone), seconds.
- ``frontier``: a sampling request of ``--frontier`` node ids (int64) answered with counts (int64 per
  node) and sources and edge ids (int64, ``--fanout`` per node): bytes moved (both ways) per second.
- ``bulk``: 8 MiB out and 8 MiB back: bytes per second.

``ratio`` = Ray / RPC for bytes per second (RPC / Ray for latency), so above 1 favours Ray. The same
cases run through a Ray Compiled Graph (``ray.dag``, ``experimental_compile``: shared-memory channels)
against plain Ray actor calls, and ``wait_cpu``: the caller's CPU seconds per second spent waiting for
an answer that takes ``--wait-ms`` (a compiled graph's reader polls its channel). Run
``python benchmarks/dist_engine.py``; results go to ``benchmarks/results/dist_engine.json``.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

import click
import numpy as np
import torch

sys.path.append(str(Path(__file__).resolve().parent))
from _report import machine, write_result  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "dist_engine.json"


def answer(ids, fanout: int):
    """The server's reply to a frontier request: counts, sources, edge ids (numpy or torch alike)."""
    n = ids.shape[0]
    if isinstance(ids, torch.Tensor):
        return torch.full((n,), fanout, dtype=torch.int64), torch.zeros(n * fanout, dtype=torch.int64), \
            torch.zeros(n * fanout, dtype=torch.int64)
    return np.full(n, fanout, dtype=np.int64), np.zeros(n * fanout, dtype=np.int64), \
        np.zeros(n * fanout, dtype=np.int64)


def echo(x):
    return x


class Server:
    """The Ray actor: the same two calls."""

    def answer(self, ids, fanout):
        return answer(ids, fanout)

    def echo(self, x):
        return x

    def call(self, request: tuple):
        """One input of a compiled graph: ``("echo", x)``, ``("answer", ids, fanout)`` or ``("sleep", s)``."""
        if request[0] == "sleep":
            time.sleep(request[1])
            return None
        return self.echo(request[1]) if request[0] == "echo" else self.answer(*request[1:])


def _median(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _cases(call_empty, call_frontier, call_bulk, frontier: int, fanout: int, repeats: int) -> dict:
    moved = 8 * frontier + 8 * frontier + 16 * frontier * fanout
    return {"empty_s": _median(call_empty, repeats),
            "frontier_bytes_per_s": moved / _median(call_frontier, repeats),
            "bulk_bytes_per_s": 2 * 8 * 2**20 / _median(call_bulk, max(repeats // 10, 3))}


def _wait_cpu(call, wait_s: float, repeats: int = 20) -> float:
    """The caller's CPU seconds per wall second of ``call`` (an answer that takes ``wait_s``)."""
    call(wait_s)
    w0, c0 = time.perf_counter(), time.process_time()
    for _ in range(repeats):
        call(wait_s)
    return (time.process_time() - c0) / (time.perf_counter() - w0)


def measure_ray(frontier: int, fanout: int, repeats: int, wait_s: float) -> tuple[dict, dict]:
    """Plain actor calls and a compiled graph on one actor: `_cases` and ``wait_cpu`` of each."""
    import ray
    from ray.dag import InputNode

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        server = ray.remote(Server).options(num_cpus=0).remote()
        ids = np.arange(frontier, dtype=np.int64)
        bulk = np.zeros(2**20, dtype=np.int64)
        plain = _cases(lambda: ray.get(server.echo.remote(None)),
                       lambda: ray.get(server.answer.remote(ids, fanout)),
                       lambda: ray.get(server.echo.remote(bulk)), frontier, fanout, repeats)
        plain["wait_cpu"] = _wait_cpu(lambda s: ray.get(server.call.remote(("sleep", s))), wait_s)
        with InputNode() as inp:
            dag = server.call.bind(inp)
        graph = dag.experimental_compile()
        try:
            def run(request):
                return graph.execute(request).get(timeout=-1)

            run(("echo", None))  # the owners' loops start at the first execution
            compiled = _cases(lambda: run(("echo", None)), lambda: run(("answer", ids, fanout)),
                              lambda: run(("echo", bulk)), frontier, fanout, repeats)
            compiled["wait_cpu"] = _wait_cpu(lambda s: run(("sleep", s)), wait_s)
        finally:
            graph.teardown()
        return plain, compiled
    finally:
        ray.shutdown()


def _rpc_worker(rank: int, port: int, frontier: int, fanout: int, repeats: int, out) -> None:
    import torch.distributed.rpc as rpc

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2,
                 rpc_backend_options=rpc.TensorPipeRpcBackendOptions(num_worker_threads=4))
    if rank == 0:
        ids = torch.arange(frontier, dtype=torch.int64)
        bulk = torch.zeros(2**20, dtype=torch.int64)
        out.update(_cases(lambda: rpc.rpc_sync("w1", echo, args=(None,)),
                          lambda: rpc.rpc_sync("w1", answer, args=(ids, fanout)),
                          lambda: rpc.rpc_sync("w1", echo, args=(bulk,)), frontier, fanout, repeats))
    rpc.shutdown()


def measure_rpc(frontier: int, fanout: int, repeats: int, port: int) -> dict:
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rpc_worker, args=(port, frontier, fanout, repeats, out), nprocs=2, join=True)
        return dict(out)


@click.command()
@click.option("--frontier", default=10_000, show_default=True, help="Node ids per frontier request.")
@click.option("--fanout", default=10, show_default=True, help="Edges per node in the reply.")
@click.option("--repeats", default=200, show_default=True)
@click.option("--port", default=29533, show_default=True, help="The RPC group's rendezvous port.")
@click.option("--wait-ms", default=50.0, show_default=True, help="The answer's delay of the wait_cpu case.")
@click.option("--output", default=str(RESULTS), show_default=True)
def main(frontier: int, fanout: int, repeats: int, port: int, wait_ms: float, output: str) -> None:
    """Round trip and bytes/s of Ray actors, a Ray Compiled Graph and torch.distributed.rpc here."""
    torch.set_num_threads(1)
    info = machine(uptime=os.getloadavg())
    rpc = measure_rpc(frontier, fanout, repeats, port)
    ray_, compiled = measure_ray(frontier, fanout, repeats, wait_ms / 1e3)
    rows = []
    for key, metric in (("empty_s", "round_trip_s"), ("frontier_bytes_per_s", "frontier_bytes_per_s"),
                        ("bulk_bytes_per_s", "bulk_bytes_per_s")):
        ratio = rpc[key] / ray_[key] if key == "empty_s" else ray_[key] / rpc[key]
        case = f"{frontier} ids x fanout {fanout}" if "frontier" in key else key.split("_")[0]
        rows.append({"case": case, "metric": metric, "ours": ray_[key],
                     "ours_engine": "ray " + __import__("ray").__version__,
                     "baseline": "torch.distributed.rpc (TensorPipe)", "baseline_value": rpc[key],
                     "ratio": ratio})
    click.echo(f"{'case':<28}{'metric':<24}{'ray':>12}{'rpc':>12}{'ray/rpc':>9}")
    for r in rows:
        click.echo(f"{r['case']:<28}{r['metric']:<24}{r['ours']:>12.4g}{r['baseline_value']:>12.4g}"
                   f"{r['ratio']:>9.2f}")
    graph_rows = []
    for key in ("empty_s", "frontier_bytes_per_s", "bulk_bytes_per_s", "wait_cpu"):
        lower = key in ("empty_s", "wait_cpu")  # ratio above 1: the compiled graph wins
        graph_rows.append({"case": key.split("_")[0] if key != "wait_cpu" else f"answer after {wait_ms} ms",
                           "metric": "round_trip_s" if key == "empty_s" else key, "ours": compiled[key],
                           "ours_engine": "ray compiled graph", "baseline": "ray actor call",
                           "baseline_value": ray_[key],
                           "ratio": ray_[key] / compiled[key] if lower else compiled[key] / ray_[key]})
    click.echo(f"{'case':<28}{'metric':<24}{'compiled':>12}{'actor':>12}{'ratio':>9}  (above 1: compiled)")
    for r in graph_rows:
        click.echo(f"{r['case']:<28}{r['metric']:<24}{r['ours']:>12.4g}{r['baseline_value']:>12.4g}"
                   f"{r['ratio']:>9.2f}")
    write_result("dist_engine", rows + graph_rows, info, output)


if __name__ == "__main__":
    main()
