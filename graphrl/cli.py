"""The ``graphrl`` command: the group every subcommand hangs on, and its two small commands.

`main` is the click group; it applies the thread policy (`graphrl.threads.configure`) before a command's
work. ``info`` prints versions, threads and what is available; ``gc`` removes shared memory left by killed
graphrl processes. The other commands live in modules of their own, registered here: ``demo``
(`graphrl.cli_demo`: the demo tasks and their learning curves), ``bench`` (`graphrl.cli_bench`: the
benchmarks at a quick size and their figures), ``train`` (`graphrl.cli_train`) and ``partition``
(`graphrl.cli_partition`). Option values click has no type for are parsed in `graphrl.cli_options`.

Two rules hold for every command. An output folder (``--out``, ``--plot``, ``--logdir``) is checked
before any work (`graphrl.cli_checks.writable_folder`). Every command runs inside
`graphrl.interrupts.interrupts`: SIGINT and SIGTERM raise `Interrupted`; a command with work worth keeping
(``train recommend``, ``demo``, ``bench``) saves it and prints one line saying what and where, and the
``graphrl`` group turns the exception into exit status 130 (SIGINT) or 143 (SIGTERM).

This module prints (through click); library code only logs.
"""

from __future__ import annotations

import os
import platform
import signal
from pathlib import Path

import click

import graphrl
from graphrl.cli_bench import bench
from graphrl.cli_demo import demo
from graphrl.cli_partition import partition
from graphrl.cli_train import train
from graphrl.interrupts import Interrupted, interrupts

__all__ = ["main"]


class InterruptibleGroup(click.Group):
    """The ``graphrl`` group: runs its command inside `interrupts`; SIGINT/SIGTERM exit 130/143.

    A command with work to keep catches `Interrupted`, saves, prints its line and raises
    ``click.exceptions.Exit(err.exit_code)``; for the others this prints one line naming the signal.
    """

    def invoke(self, ctx: click.Context):
        with interrupts():
            try:
                return super().invoke(ctx)
            except KeyboardInterrupt as err:  # an Interrupted, or Ctrl-C outside the main thread
                err = err if isinstance(err, Interrupted) else Interrupted(signal.SIGINT)
                click.echo(f"interrupted by {err.name}", err=True)
                ctx.exit(err.exit_code)


@click.group(cls=InterruptibleGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(graphrl.__version__, prog_name="graphrl")
@click.pass_context
def main(ctx: click.Context) -> None:
    """graphrl: GNN training fed by our own neighbour sampler, and trajectory replay for RL."""
    if ctx.invoked_subcommand not in (None, "gc"):  # gc stays light: it computes nothing
        _thread_policy()


def _thread_policy() -> None:
    """Apply `graphrl.threads.configure` (``$GRAPHRL_THREADS``, else the cores) before a command's work;
    a bad ``GRAPHRL_THREADS`` is a usage error naming it. (``train recommend --threads`` sets it again.)"""
    from graphrl.threads import configure

    try:
        configure()
    except ValueError as err:
        raise click.UsageError(str(err)) from None


@main.command()
def info() -> None:
    """Print versions, thread counts and which accelerators and optional libraries are available."""
    import numba
    import numpy
    import torch

    click.echo(f"graphrl {graphrl.__version__}")
    click.echo(f"python {platform.python_version()} ({platform.machine()}, {os.cpu_count()} CPUs)")
    click.echo(f"torch {torch.__version__}")
    click.echo(f"numba {numba.__version__}")
    click.echo(f"numpy {numpy.__version__}")
    click.echo(f"torch threads: {torch.get_num_threads()} (inter-op {torch.get_num_interop_threads()})")
    try:
        layer = numba.threading_layer()
    except ValueError:  # no parallel numba function has run yet in this process
        layer = f"not yet chosen, config {numba.config.THREADING_LAYER!r}"
    click.echo(f"numba threads: {numba.get_num_threads()} (threading layer: {layer})")
    cuda = torch.cuda.is_available()
    detail = f" ({torch.cuda.device_count()} devices: {torch.cuda.get_device_name(0)})" if cuda else ""
    click.echo(f"CUDA available: {'yes' if cuda else 'no'}{detail}")
    try:
        from numba import cuda as numba_cuda

        nb_cuda = bool(numba_cuda.is_available())
    except ImportError:
        nb_cuda = False
    click.echo(f"numba.cuda available: {'yes' if nb_cuda else 'no'}")
    try:
        from graphrl.dglshim import import_dgl

        dgl = import_dgl()
        click.echo(f"DGL available: yes ({dgl.__version__})")
    except ImportError as err:
        click.echo(f"DGL available: no ({str(err).splitlines()[0] if str(err) else type(err).__name__})")
    env = os.environ.get("GRAPHRL_DATA")
    if env:
        found = "found" if (Path(env) / "gowalla" / "train.txt").is_file() else "missing"
        click.echo(f"data: GRAPHRL_DATA={env} (gowalla {found})")
    else:
        click.echo("data: GRAPHRL_DATA is not set")


@main.command()
@click.option("--dry-run", is_flag=True, help="List the segments that would be removed; remove nothing.")
def gc(dry_run: bool) -> None:
    """Remove the shared-memory segments (/dev/shm) of graphrl processes that are gone (killed by SIGKILL).

    A segment's name records its owner's pid, start time and pid namespace; a segment goes when that
    process no longer runs (or its pid now runs another process). Live owners' segments, other users'
    files and names that are not graphrl's are never touched.
    """
    from graphrl.memory.owners import reclaim

    found = reclaim(dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for seg in found:
        click.echo(f"{verb} {seg.name} ({seg.nbytes} bytes; pid {seg.owner.pid} {seg.reason})")
    click.echo(f"{verb} {len(found)} segments, {sum(seg.nbytes for seg in found)} bytes")


main.add_command(demo)
main.add_command(bench)
main.add_command(train)
main.add_command(partition)

if __name__ == "__main__":  # pragma: no cover
    main()
