"""nbgrader configuration of the decodesched course (run nbgrader commands from this folder).

`decodesched assignment build` runs `nbgrader generate_assignment decode_scheduling` here and checks
the release; `decodesched grade` copies this folder per submission and autogrades there.
"""

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "decodesched"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
# The release keeps the seed's stub: the region becomes "# YOUR CODE HERE" + NotImplementedError.
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
# Per-cell execution limits inside nbgrader (the grader adds its own wall-clock/CPU/memory limits).
c.Execute.timeout = 60
c.Execute.startup_timeout = 60
c.Execute.interrupt_on_timeout = True
