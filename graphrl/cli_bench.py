"""``graphrl bench``: the benchmarks at a quick size, and their figures.

`bench` runs ``benchmarks/NAME.py`` (sampler, replay, features, full_graph) as subprocesses through
`graphrl.bench.run_benchmarks`, each writing NAME.json and NAME.log into ``--out``, and with ``--plot``
draws them (`graphrl.plots.plot_benchmarks`); ``--from-json DIR --plot OUT`` re-plots saved results. An
interrupted run keeps the finished results (`graphrl.bench` writes its record) and says what and where.

Registered on the ``graphrl`` group by `graphrl.cli`; this module prints (through click).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from graphrl.cli_checks import writable_folder
from graphrl.interrupts import Interrupted

__all__ = ["bench"]


@click.command()
@click.option("--only", default=",".join(("sampler", "replay", "features", "full_graph")), show_default=True,
              help="Comma-separated subset of the benchmarks to run.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="benchmarks/results/bench",
              show_default=True, help="Folder for the benchmarks' JSON results and logs.")
@click.option("--plot", "plot_dir", type=click.Path(file_okay=False), default=None,
              help="Write bench_<name>.png figures into this folder (needs the plot extra).")
@click.option("--from-json", "from_json", type=click.Path(file_okay=False, exists=True), default=None,
              help="Do not run: plot the results already in this folder (with --plot).")
@click.option("--benchmarks", "bench_dir", type=click.Path(file_okay=False), default=None,
              help="Folder of the benchmark scripts (default: benchmarks/ of the source tree).")
def bench(only: str, out_dir: str, plot_dir: str | None, from_json: str | None,
          bench_dir: str | None) -> None:
    """Run the benchmarks (sampler, replay, features, full_graph) at a quick size, about 5 minutes on 2 cores.

    Each runs as a subprocess of this Python and writes NAME.json (and NAME.log, its table) into
    ``--out``; ``--plot DIR`` then draws the figures: sampled edges/s vs DGL (and PyG where it runs),
    replay GB/s vs TorchRL and a plain copy, feature-gather GB/s vs index_select and a copy, full-graph
    epoch time vs DGL with and without a device budget. ``--from-json DIR --plot OUT`` re-plots.
    """
    from graphrl import bench as bench_mod

    if from_json is not None and plot_dir is None:
        raise click.UsageError("--from-json only plots: give --plot DIR too")
    names = [n.strip() for n in only.split(",") if n.strip()]
    outs = (bench_mod.FILE_NAME, *(f"{n}{ext}" for n in names for ext in (".json", ".log")))
    for folder, option, files in ((plot_dir, "--plot", tuple(f"bench_{n}.png" for n in names)),
                                  (None if from_json else out_dir, "--out", outs)):
        if folder is not None:
            writable_folder(folder, option, files)
    if plot_dir is not None:
        from graphrl.plots import require_matplotlib

        try:
            require_matplotlib()
        except ImportError as err:
            raise click.ClickException(str(err)) from None
    if from_json is None:
        try:
            record = bench_mod.run_benchmarks(names, out_dir, folder=bench_dir, echo=click.echo)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--only") from None
        except FileNotFoundError as err:
            raise click.ClickException(str(err)) from None
        except Interrupted as err:
            _bench_interrupted(err, out_dir)
            raise click.exceptions.Exit(err.exit_code) from None
        failed = [n for n, r in record["benchmarks"].items() if r["returncode"] != 0]
        click.echo(f"bench: {len(names) - len(failed)} of {len(names)} benchmarks ran in "
                   f"{record['seconds']:.0f} s; results in {out_dir}")
    if plot_dir is None:
        return
    from graphrl.plots import plot_benchmarks

    try:
        results, record = bench_mod.load_results(from_json or out_dir)
    except FileNotFoundError as err:
        raise click.ClickException(str(err)) from None
    for path in plot_benchmarks(results, plot_dir, machine=(record or {}).get("machine")):
        click.echo(f"wrote {path}")
    if from_json is None and failed:
        raise click.ClickException(f"benchmarks failed: {', '.join(failed)} (see their .log in {out_dir})")


def _bench_interrupted(err: Interrupted, out_dir: str) -> None:
    """Say what an interrupted ``bench`` kept (`run_benchmarks` wrote its record) and where."""
    from graphrl.bench import FILE_NAME

    path = Path(out_dir) / FILE_NAME
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        click.echo(f"interrupted by {err.name}: nothing saved")
        return
    running = (record.get("interrupted") or {}).get("benchmark", "?")
    done = [n for n, r in record["benchmarks"].items() if n != running and r["returncode"] == 0]
    click.echo(f"interrupted by {err.name} during {running}: saved {path.name} "
               f"({', '.join(done) + ' done' if done else 'no benchmark finished'}) to {out_dir}")
