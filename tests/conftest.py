"""Shared pytest set-up: seeded Hypothesis profiles and the helpers in tests/oracle.py."""

import os
import signal
import sys
from pathlib import Path

from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent))

# The tests interrupt their commands as Ctrl-C in a terminal does. Under nohup or `cmd &` a shell starts its jobs
# with SIGINT ignored, every process started from here would inherit that, and a Python started so installs no
# KeyboardInterrupt handler: nothing could interrupt it. Caught here, SIGINT reaches every child at its default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Seeded (derandomized) so CI is reproducible; failures still shrink to a minimal trace.
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("dev", deadline=None, max_examples=50)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
