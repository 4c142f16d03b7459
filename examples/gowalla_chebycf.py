"""ChebyCF on Gowalla: a training-free Chebyshev graph filter, tuned on a validation split, tested once.

ChebyCF (Kim et al., SIGIR 2025; `graphrl.nn.graph_filter.ChebyCF`) filters each user's interaction row
with a degree-K Chebyshev interpolation of a plateau low-pass on the item-item Laplacian, adds an ideal-pass
term from the top-k right singular vectors of the normalised matrix, and wraps both in an item-degree
normalisation. There is no training: one randomised SVD, then K double sparse products per user batch.

``--tune`` carves a 20 % validation split from the training interactions (`holdout_validation`, seed 0,
as ``graphrl train recommend`` does), fits once per degree exponent on the rest and ranks every grid point
(order, flatness, ideal k, ideal weight) on the validation users from one set of Chebyshev terms per batch;
it prints the grid best first and writes it to ``--out``. Without ``--tune`` it fits the given settings
on all training interactions and prints test recall@20 / NDCG@20. The defaults are the setting the
validation grid chose (the paper's Gowalla setting with ideal weight 0.3 for its 0.2); docs/performance.md
has the grid and the test figure.

    python examples/gowalla_chebycf.py --tune --out runs/chebycf_tune.json
    python examples/gowalla_chebycf.py --order 8 --flatness 1.5 --ideal-k 512 --ideal-weight 0.3 --beta 0.4
"""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path

import click
import numpy as np
import torch
from tqdm import tqdm

from graphrl.cli_checks import writable_folder
from graphrl.datasets import load_gowalla
from graphrl.datasets.validation import holdout_validation
from graphrl.nn.graph_filter import ChebyCF, chebyshev_coefficients
from graphrl.train.metrics import concat_ranges, evaluate_ranking, ndcg_recall_from_topk, topk_items


def _list(kind: type, low: float, low_open: bool):
    """A click callback: a comma-separated list of ``kind`` values, each >= ``low`` (> with ``low_open``)."""
    def parse(ctx: click.Context, param: click.Parameter, text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",")]
        except ValueError:
            raise click.BadParameter(f"a comma-separated list of {kind.__name__}s, got {text!r}") from None
        if any(v < low or (low_open and v == low) or v != v for v in values):
            raise click.BadParameter(f"each must be {'>' if low_open else '>='} {low:g}, got {text!r}")
        return values
    return parse


def _writable_parent(ctx: click.Context, param: click.Parameter, out: str | None) -> str | None:
    if out is not None:
        writable_folder(Path(out).parent, "--out")  # refused now, not after the tuning
    return out


def tune(ds, betas, orders, flatness, ideal_ks, weights, users_cap: int, batch: int, seed: int) -> list[dict]:
    """Validation recall@20 / NDCG@20 of every grid point (fits on 80 % of train, scores the other 20 %)."""
    split = holdout_validation(ds, fraction=0.2, seed=0)
    train, (v_indptr, v_items) = split.dataset.user_item_csr("train"), split.validation_csr()
    users = np.flatnonzero(np.diff(v_indptr) > 0)
    if users_cap and users.size > users_cap:
        users = np.sort(np.random.default_rng(seed).choice(users, users_cap, replace=False))
    grid = list(itertools.product(orders, flatness, ideal_ks, weights))
    rows = []
    t0 = time.perf_counter()
    fitted = ChebyCF.fit(train, ds.num_items, order=max(orders), ideal_k=max(ideal_ks), seed=seed)
    fit_s = time.perf_counter() - t0
    click.echo(f"fit (one SVD, k = {max(ideal_ks)}): {fit_s:.0f} s; 1-min load {os.getloadavg()[0]:.1f}")
    for beta in betas:
        t0 = time.perf_counter()
        model = fitted.with_settings(max(orders), 1.0, 0.0, beta)
        coeffs = {(k, phi): chebyshev_coefficients(k, phi) for k in orders for phi in flatness}
        sums = np.zeros((len(grid), 2))
        for start in tqdm(range(0, users.size, batch), desc=f"beta {beta:g}", leave=False):
            ub = users[start:start + batch]
            s = model.signal(torch.from_numpy(ub))
            terms = torch.from_numpy(np.stack(list(model.terms(s, max(orders)))))  # [K + 1, I, B]
            proj = s @ model.vt.T
            ideal = {k: torch.from_numpy((proj[:, :k] @ model.vt[:k]).T.copy()) for k in ideal_ks}
            post = torch.from_numpy(model.post_scale)[:, None]
            s0, e0 = train[0][ub], train[0][ub + 1]
            mask = (torch.from_numpy(np.repeat(np.arange(ub.size), e0 - s0)),
                    torch.from_numpy(train[1][concat_ranges(s0, e0)]))
            for (k, phi), c in coeffs.items():
                cheb = torch.tensordot(torch.from_numpy(c.astype(np.float32)), terms[:k + 1], dims=1)
                for g, point in enumerate(grid):
                    if point[:2] != (k, phi):
                        continue
                    scores = ((cheb + point[3] * ideal[point[2]]) * post).T.contiguous()
                    scores[mask] = -torch.inf
                    rec, ndcg = ndcg_recall_from_topk(topk_items(scores, 20), v_indptr, v_items,
                                                      torch.from_numpy(ub))
                    sums[g] += (float(rec.sum()), float(ndcg.sum()))
        for g, (k, phi, ik, w) in enumerate(grid):
            rows.append({"beta": beta, "order": k, "flatness": phi, "ideal_k": ik, "ideal_weight": w,
                         "val_recall": sums[g, 0] / users.size, "val_ndcg": sums[g, 1] / users.size,
                         "fit_s": fit_s, "users": int(users.size)})
        click.echo(f"beta {beta:g}: grid {time.perf_counter() - t0:.0f} s; "
                   f"1-min load {os.getloadavg()[0]:.1f}")
    return sorted(rows, key=lambda r: -r["val_recall"])


@click.command()
@click.option("--order", type=click.IntRange(min=1), default=8, show_default=True, help="Chebyshev degree K.")
@click.option("--flatness", type=click.FloatRange(min=0, min_open=True), default=1.5, show_default=True,
              help="Plateau flatness phi.")
@click.option("--ideal-k", type=click.IntRange(min=0), default=512, show_default=True,
              help="Singular vectors of the ideal-pass term.")
@click.option("--ideal-weight", type=click.FloatRange(min=0), default=0.3, show_default=True)
@click.option("--beta", type=click.FloatRange(min=0), default=0.4, show_default=True,
              help="Item-degree exponent of the normalisation.")
@click.option("--tune", "tune_", is_flag=True,
              help="Rank a grid on a 20 % validation split instead of testing.")
@click.option("--betas", default="0.3,0.4,0.5", show_default=True, callback=_list(float, 0, False),
              help="--tune: degree exponents.")
@click.option("--orders", default="8,10", show_default=True, callback=_list(int, 1, False),
              help="--tune: Chebyshev degrees.")
@click.option("--flatnesses", default="1,1.5,2", show_default=True, callback=_list(float, 0, True),
              help="--tune: plateau flatness values.")
@click.option("--ideal-ks", default="256,512", show_default=True, callback=_list(int, 0, False),
              help="--tune: ideal-pass sizes.")
@click.option("--ideal-weights", default="0.1,0.2,0.3", show_default=True, callback=_list(float, 0, False),
              help="--tune: ideal-pass weights.")
@click.option("--tune-users", type=click.IntRange(min=0), default=3072, show_default=True,
              help="--tune: score this many validation users drawn at random (0: all).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, callback=_writable_parent,
              help="--tune: write the grid here.")
@click.option("--seed", type=int, default=0, show_default=True, help="The SVD's seed (and the users drawn).")
@click.option("--data-root", type=click.Path(file_okay=False), default=None)
def main(order, flatness, ideal_k, ideal_weight, beta, tune_, betas, orders, flatnesses, ideal_ks,
         ideal_weights, tune_users, out, seed, data_root) -> None:
    """Tune ChebyCF on a validation split, or fit it on Gowalla's training interactions and test it."""
    load0 = os.getloadavg()[0]
    ds = load_gowalla(data_root)
    t0 = time.perf_counter()
    if tune_:
        rows = tune(ds, betas, orders, flatnesses, ideal_ks, ideal_weights, tune_users, 512, seed)
        for r in rows[:15]:
            click.echo(f"beta {r['beta']:g} K {r['order']} phi {r['flatness']:g} k {r['ideal_k']} "
                       f"w {r['ideal_weight']:g}: validation recall@20 {r['val_recall']:.4f} "
                       f"NDCG@20 {r['val_ndcg']:.4f}")
        if out:
            Path(out).parent.mkdir(parents=True, exist_ok=True)
            Path(out).write_text(json.dumps({"rows": rows, "load": [load0, os.getloadavg()[0]]}, indent=1))
            click.echo(f"wrote {out}")
        return
    train = ds.user_item_csr("train")
    try:
        model = ChebyCF.fit(train, ds.num_items, order=order, flatness=flatness, ideal_k=ideal_k,
                            ideal_weight=ideal_weight, degree_power=beta, seed=seed)
    except ValueError as err:  # a setting out of range for this data (ideal_k >= min(users, items))
        raise click.UsageError(str(err)) from None
    fit_s = time.perf_counter() - t0
    result = evaluate_ranking(model.scores, train, ds.user_item_csr("test"), k=20, batch_size=512,
                              copy_scores=False)
    click.echo(f"ChebyCF K={order} phi={flatness:g} k={ideal_k} w={ideal_weight:g} beta={beta:g}: "
               f"test recall@20 {result.recall:.4f}  NDCG@20 {result.ndcg:.4f}; fit {fit_s:.1f} s, "
               f"total {time.perf_counter() - t0:.1f} s; 1-min load {load0:.1f} -> {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
