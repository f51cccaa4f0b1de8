"""decodesched: a fast, exact simulator of LLM decode scheduling, and the course unit built on it.

>>> import decodesched
>>> sim = decodesched.DecodeSchedulerSim(policy="aging", free_kv_blocks=4)
>>> sim.enqueue(request_id=1, prompt_len=3, max_new_tokens=1)
>>> [e["action"] for e in sim.run()]
['prefill_to_decode', 'finish']
"""

__version__ = "0.1.0"

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
