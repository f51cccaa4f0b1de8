"""The per-request trace arrays every replay kernel takes, defined once.

`TRACE_FIELDS` lists them in the kernels' argument order, each with its dtype and whether it is a
column of a trace file.  Everything else is derived from it: `engine.trace_arrays` (the arrays
passed to a kernel, and concatenated for the batch kernels), the file columns and their parsing
types in `decodesched.trace`, and the kernels' own parameter lists are checked against it
(tests/test_fast_kernel.py).  ``has_deadline`` says where ``deadline_step`` (0 there otherwise)
holds a deadline; ``order`` is the rows sorted by (arrival_step, row), computed once per trace.
"""

# (name, dtype, a column of trace files)
TRACE_FIELDS = (
    ("request_id", "int64", True),
    ("arrival_step", "int64", True),
    ("prompt_len", "int64", True),
    ("max_new_tokens", "int64", True),
    ("priority", "int64", True),
    ("cache_hit", "bool", True),
    ("required_blocks", "int64", True),
    ("deadline_step", "int64", True),
    ("has_deadline", "bool", False),
    ("preemptible", "bool", True),
    ("order", "int64", False),
)

# The kernels' leading parameters, in order.
KERNEL_TRACE_ARGS = tuple(name for name, _, _ in TRACE_FIELDS)
# The columns of a trace file, in order (deadline_step may be empty there: no deadline).
FILE_COLUMNS = tuple(name for name, _, in_file in TRACE_FIELDS if in_file)
