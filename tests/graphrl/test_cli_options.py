"""graphrl.cli_options: the one parser of comma-separated integer options, and the size callback."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from graphrl.cli_options import check_size, int_list


@pytest.mark.parametrize("text, count, want", [("10", None, [10]), ("10,5,-1", None, [10, 5, -1]),
                                               (" 10 , 5", None, [10, 5]),
                                               ("1000000,20000000", 2, [10**6, 2 * 10**7])])
def test_int_list_reads_the_integers(text, count, want):
    assert int_list(text, "--fanouts", count=count) == want


@pytest.mark.parametrize("text", ["", "10,", "10,,5", ",10", "10,x", "1 0", "10.5"])
def test_int_list_refuses_a_bad_item_naming_the_option_and_the_text(text):
    with pytest.raises(click.BadParameter) as err:
        int_list(text, "--fanouts")
    message = err.value.format_message()
    assert "--fanouts" in message and f"got {text!r}" in message


def test_int_list_counts_and_names_what_it_wants():
    with pytest.raises(click.BadParameter, match=r"expected 3 comma-separated integers, got '1,2'"):
        int_list("1,2", "--synthetic-size", count=3)
    with pytest.raises(click.BadParameter, match=r"expected NODES,EDGES \(two integers\), got '5'"):
        int_list("5", None, count=2, names="NODES,EDGES (two integers)")


def test_check_size_refuses_at_parse_time_and_passes_a_good_size_on():
    @click.command()
    @click.option("--budget", callback=check_size)
    def cmd(budget):
        click.echo(f"budget={budget}")

    assert CliRunner().invoke(cmd, ["--budget", "256KiB"]).output == "budget=256KiB\n"
    bad = CliRunner().invoke(cmd, ["--budget", "lots"])
    assert bad.exit_code == 2 and "Invalid value for '--budget'" in bad.output and "'lots'" in bad.output
