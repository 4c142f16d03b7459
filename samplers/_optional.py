"""Classes whose base class lives in an optional library that is imported only when one is built.

`samplers.PygSampler` subclasses PyG's ``BaseSampler`` and `samplers.DglSampler` DGL's ``Sampler``, yet
``import samplers`` must not import PyG or DGL. Each adapter is written as a plain class (the
"front"); `LazyBase.__new__` builds, once per front class, the real class ``class Front(front,
base)`` with ``base`` returned by the front's ``optional_base()`` static method, and returns an instance
of it. So ``isinstance(s, samplers.PygSampler)`` and
``isinstance(s, torch_geometric.sampler.BaseSampler)`` both hold, and the library is imported at the
first construction. Pickling goes through the front class (so a spawned worker rebuilds the bound
class), as far as the instance's own state pickles.

Use: ``class PygSampler(LazyBase)`` with ``@staticmethod def optional_base(): ...`` returning the
base class (raising ImportError with the remedy when the library is missing). `import_pyg` is that
import for PyG (the adapters in `samplers.pyg_sampler` and `samplers.pyg_hetero` share it).
"""

from __future__ import annotations

import threading
import types

__all__ = ["LazyBase", "import_pyg", "restore"]

_LOCK = threading.Lock()


def import_pyg():
    """Import and return ``torch_geometric`` (with its ``sampler`` and ``data`` subpackages).

    Raises
    ------
    ImportError
        PyG is not installed (remedy: the ``pyg`` extra, ``pip install -e '.[pyg]'``).
    """
    try:
        import torch_geometric
        import torch_geometric.data
        import torch_geometric.sampler  # noqa: F401
    except ModuleNotFoundError as err:
        raise ImportError("PygSampler needs torch_geometric; install the 'pyg' extra "
                          "(pip install -e '.[pyg]')") from err
    return torch_geometric


def restore(front: type, state: dict):
    """Rebuild a pickled `LazyBase` instance of ``front`` from its ``__dict__`` (no ``__init__`` call)."""
    obj = LazyBase.__new__(front)
    obj.__dict__.update(state)
    return obj


class LazyBase:
    """Base of the adapters: instances are of ``front`` mixed with its ``optional_base()``."""

    @staticmethod
    def optional_base() -> type:  # pragma: no cover - every front overrides it
        """The optional library's base class (imports the library)."""
        raise NotImplementedError

    def __new__(cls, *args, **kwargs):
        front = cls
        while "optional_base" not in front.__dict__ and front.__bases__[0] is not LazyBase:
            front = front.__bases__[0]
        real = front.__dict__.get("bound_class")
        if real is None:
            with _LOCK:
                real = front.__dict__.get("bound_class")
                if real is None:
                    base = front.optional_base()
                    real = types.new_class(front.__name__, (front, base), {})
                    real.__module__ = front.__module__
                    real.__doc__ = front.__doc__
                    front.bound_class = real
        target = real if cls is front else cls
        return object.__new__(target)

    def __reduce__(self):
        front = type(self)
        while "optional_base" not in front.__dict__:
            front = front.__bases__[0]
        return restore, (front, dict(self.__dict__))
