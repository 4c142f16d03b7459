"""Sampling modes: one module per rule, each a `Mode` that owns its plan and choose steps on the CPU
and on CUDA; `samplers.layers` runs any of them over plain and typed graphs.

`MODES` maps a mode's name to its class: adding a mode is its own module plus one entry here.

>>> from samplers.modes import MODES
>>> mode = MODES["labor"](importance_sampling=1, want_weights=True)
"""

from samplers.modes.base import LayerEdges, LayerRequest, Mode, RelationArrays
from samplers.modes.labor import LaborMode
from samplers.modes.temporal import TemporalMode
from samplers.modes.uniform import UniformMode
from samplers.modes.weighted import WeightedMode

MODES: dict[str, type[Mode]] = {
    UniformMode.name: UniformMode,
    WeightedMode.name: WeightedMode,
    TemporalMode.name: TemporalMode,
    LaborMode.name: LaborMode,
}
"""Every mode by name."""

__all__ = ["MODES", "LaborMode", "LayerEdges", "LayerRequest", "Mode", "RelationArrays", "TemporalMode",
           "UniformMode", "WeightedMode"]
