"""Integer constants shared by every kernel and by the Python API.

Numba reads module-level integers as compile-time constants, so kernels use these names
directly.  This is the only place where they are defined.
"""

# Policies (the seed's three, plus FCFS from the research issue).
POLICY_FIXED_PRIORITY = 0
POLICY_AGING = 1
POLICY_DEADLINE = 2
POLICY_FCFS = 3
POLICY_NAMES = ("fixed_priority", "aging", "deadline", "fcfs")

# The seed's deadline slack for a request without a deadline (or under another policy).
NO_DEADLINE_SLACK = 1_000_000_000

# Phases.
PHASE_PREFILL = 0
PHASE_DECODE = 1
PHASE_NAMES = ("prefill", "decode")

# Request status (the seed's four).
STATUS_WAITING = 0
STATUS_RUNNING = 1
STATUS_PREEMPTED = 2
STATUS_FINISHED = 3
STATUS_NAMES = ("waiting", "running", "preempted", "finished")

# Event actions.
ACTION_PREFILL_TO_DECODE = 0
ACTION_DECODE_ONE_STEP = 1
ACTION_FINISH = 2
ACTION_NAMES = ("prefill_to_decode", "decode_one_step", "finish")

# "No row" (no victim, never ran). Rows are >= 0; request ids may be negative, so a
# missing request is always encoded as a row, never as an id.
NO_ROW = -1
# "Never happened" for step columns (first_step, first_token_step, finish_step).
NEVER = -1

# Columns of the event log, an int64 array of shape (n_events, EV_NCOLS).
EV_STEP = 0           # clock when the event ran
EV_ROW = 1            # trace row of the chosen request
EV_ACTION = 2         # ACTION_*
EV_GENERATED = 3      # generated_len after the step
EV_WAIT = 4           # wait_steps of the chosen request
EV_FREE = 5           # free_kv_blocks after the step
EV_VICTIM_ROW = 6     # trace row of the preempted request, or NO_ROW
EV_MISSED = 7         # deadline_missed (0/1)
EV_NCOLS = 8

# Columns of the per-request final state, an int64 array of shape (n_requests, RQ_NCOLS).
RQ_ENQUEUED = 0       # 1 if the request arrived before the replay stopped
RQ_PHASE = 1          # PHASE_*
RQ_STATUS = 2         # STATUS_*
RQ_GENERATED = 3
RQ_WAIT = 4
RQ_PREEMPTIONS = 5
RQ_ADMITTED = 6       # 0/1
RQ_FIRST_STEP = 7     # clock of its prefill step, or NEVER
RQ_FIRST_TOKEN_STEP = 8  # clock of its first decode step, or NEVER
RQ_FINISH_STEP = 9    # clock of its finish step, or NEVER
RQ_NCOLS = 10

# Summary returned by a replay kernel, an int64 array of length SM_NCOLS.
SM_EVENTS = 0         # steps that ran (= events, recorded or not)
SM_CLOCK = 1          # clock when the replay stopped
SM_FREE = 2           # free_kv_blocks when the replay stopped
SM_STOP = 3           # STOP_*
SM_NCOLS = 4

# Why a replay stopped.
STOP_DRAINED = 0      # every request finished
STOP_STUCK = 1        # nothing could run and nothing is left to arrive: the rest is unservable
STOP_MAX_STEPS = 2    # max_steps steps ran
STOP_NAMES = ("drained", "stuck", "max_steps")
