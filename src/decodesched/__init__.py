"""decodesched: a fast, exact simulator of LLM decode scheduling, and the course unit built on it.

>>> import decodesched
>>> sim = decodesched.DecodeSchedulerSim(policy="aging", free_kv_blocks=4)
>>> sim.enqueue(request_id=1, prompt_len=3, max_new_tokens=1)
>>> [e["action"] for e in sim.run()]
['prefill_to_decode', 'finish']
"""

__version__ = "0.1.0"

import sys as _sys  # noqa: E402


class _KernelCacheHook:
    """Installs `decodesched._numba_cache` (where the kernels' Numba cache lives) just before the first
    kernel module is imported, so that ``import decodesched`` itself does not import Numba."""

    LIGHT = ("decodesched.kernels", "decodesched.kernels.enums", "decodesched.kernels.stamp")

    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("decodesched.kernels.") and fullname not in self.LIGHT:
            _sys.meta_path.remove(self)
            from . import _numba_cache

            _numba_cache.install()
        return None


if not any(type(f).__name__ == "_KernelCacheHook" for f in _sys.meta_path):
    _sys.meta_path.insert(0, _KernelCacheHook())

from .model import DecodeSchedulerSim, RequestState  # noqa: E402
from .trace import Trace, TraceError, load_trace  # noqa: E402
from .engine import SimulationResult, simulate  # noqa: E402
from .batch import BatchResult, Scenario, grid, simulate_batch  # noqa: E402
from .policy import Policy  # noqa: E402

__all__ = [
    "DecodeSchedulerSim",
    "Policy",
    "RequestState",
    "SimulationResult",
    "BatchResult",
    "Scenario",
    "grid",
    "simulate_batch",
    "Trace",
    "TraceError",
    "load_trace",
    "simulate",
    "__version__",
]
