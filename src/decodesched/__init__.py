"""decodesched: a fast, exact simulator of LLM decode scheduling, and the course unit built on it.

>>> import decodesched
>>> sim = decodesched.DecodeSchedulerSim(policy="aging", free_kv_blocks=4)
>>> sim.enqueue(request_id=1, prompt_len=3, max_new_tokens=1)
>>> [e["action"] for e in sim.run()]
['prefill_to_decode', 'finish']
"""

__version__ = "0.1.0"

import sys as _sys


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

# The public names, imported on first use (PEP 562): ``import decodesched`` (and so the `decodesched`
# command's start, whose Ctrl-C would otherwise print a traceback) imports no NumPy or Numba.
_PUBLIC = {
    "DecodeSchedulerSim": "model",
    "RequestState": "model",
    "Trace": "trace",
    "TraceError": "trace",
    "load_trace": "trace",
    "SimulationResult": "engine",
    "simulate": "engine",
    "BatchResult": "batch",
    "Scenario": "batch",
    "grid": "batch",
    "simulate_batch": "batch",
    "Policy": "policy",
}

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


def __getattr__(name: str):
    """A public name (imported from its module on first use, then kept), or a submodule
    (``decodesched.batch`` after a bare ``import decodesched``, as when the names were imported eagerly)."""
    import importlib

    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
        globals()[name] = value
        return value
    if not name.startswith("__"):
        import importlib.util

        try:
            found = importlib.util.find_spec(f"{__name__}.{name}") is not None
        except (ImportError, ValueError):
            found = False
        if found:
            return importlib.import_module(f".{name}", __name__)  # (the import sets the attribute too)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(__all__))
