"""The one place that imports DGL, for interop, tests and benchmarks that compare against it.

Why a shim: the registry's ``dgl==2.1.0`` wheel imports its ``dgl.graphbolt`` subpackage from
``dgl/__init__.py``. GraphBolt loads a C++ library built per torch version, and the wheel ships it only
for torch <= 2.2; with torch 2.13 the import fails (missing library, or ``torchdata.datapipes``, which
newer torchdata removed). Nothing we use from DGL (graphs, ``sample_neighbors``,
``dgl.dataloading.NeighborSampler``, blocks) needs GraphBolt, so `import_dgl` puts an empty module
under ``sys.modules["dgl.graphbolt"]`` before the first ``import dgl``. It also selects the PyTorch
backend (``DGLBACKEND=pytorch``) unless the caller chose one.

Use ``dgl = import_dgl()`` instead of ``import dgl`` everywhere; ``dgl.graphbolt`` is then an empty
module, so code that needs GraphBolt itself cannot use this shim.
"""

from __future__ import annotations

import importlib
import os
import sys
import types

__all__ = ["dgl_available", "import_dgl", "stub_graphbolt"]


def import_dgl() -> types.ModuleType:
    """Import and return the ``dgl`` module with its GraphBolt subpackage stubbed out (see module docs).

    Returns
    -------
    types.ModuleType
        The ``dgl`` module (cached by Python after the first call).

    Raises
    ------
    ImportError
        DGL is not installed (install the ``dgl`` extra: ``pip install -e '.[dgl]'``), or it fails to
        import for a reason other than GraphBolt.
    """
    if "dgl" in sys.modules and getattr(sys.modules["dgl"], "__version__", None) is not None:
        return sys.modules["dgl"]
    stubbed = stub_graphbolt()
    try:
        return importlib.import_module("dgl")
    except ModuleNotFoundError as err:
        if stubbed:
            sys.modules.pop("dgl.graphbolt", None)
        if err.name == "dgl":
            raise ImportError(
                "DGL is not installed; install the 'dgl' extra (pip install -e '.[dgl]', which asks "
                "for dgl>=2.1.0) to compare against or convert to DGL"
            ) from err
        raise ImportError(f"DGL is installed but failed to import: {err}") from err


def stub_graphbolt() -> bool:
    """Put the empty ``dgl.graphbolt`` stand-in under ``sys.modules`` and select the PyTorch backend,
    without importing DGL (for a process whose code runs ``import dgl`` itself, e.g. a spawned child of
    DGL's own tests); return whether the stub was installed now (False: a module was already there)."""
    os.environ.setdefault("DGLBACKEND", "pytorch")
    if "dgl.graphbolt" in sys.modules:
        return False
    stub = types.ModuleType("dgl.graphbolt")
    stub.__doc__ = "Empty stand-in installed by graphrl.dglshim: GraphBolt needs torch <= 2.2."
    sys.modules["dgl.graphbolt"] = stub
    return True


def dgl_available() -> bool:
    """Whether `import_dgl` succeeds (DGL installed and importable with the GraphBolt stub)."""
    try:
        import_dgl()
    except ImportError:
        return False
    return True
