"""graphrl: the shared core (memory, tensors, graph storage, datasets) and the application layer."""

from graphrl.errors import GPUUnavailableError
from graphrl.graph import CSCGraph

__version__ = "0.1.0"
__all__ = ["CSCGraph", "GPUUnavailableError", "__version__"]
