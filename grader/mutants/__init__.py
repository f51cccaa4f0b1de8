"""One-bug solution cells (each file's first line names its bug): the grader self-check's library."""
