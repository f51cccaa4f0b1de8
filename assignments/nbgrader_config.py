"""nbgrader configuration of the decodesched course (run nbgrader commands from this folder).

`decodesched assignment build` runs `nbgrader generate_assignment decode_scheduling` here and checks
the release; `decodesched grade` copies this folder per submission and autogrades there.
"""

c = get_config()  # noqa: F821 - provided by traitlets when nbgrader loads this file

c.CourseDirectory.course_id = "decodesched"
c.CourseDirectory.db_url = "sqlite:///gradebook.db"
# Each solution region becomes "# YOUR CODE HERE" + a NotImplementedError that tells the student what to do.
c.ClearSolutions.code_stub = {
    "python": '# YOUR CODE HERE\nraise NotImplementedError("TODO 未完成：把这一行换成你的代码 / '
              'TODO not done: replace this line with your code")'
}
c.ClearSolutions.begin_solution_delimeter = "BEGIN SOLUTION"
c.ClearSolutions.end_solution_delimeter = "END SOLUTION"
# Per-cell execution limits inside nbgrader (the grader adds its own wall-clock/CPU/memory limits).
c.Execute.timeout = 60
c.Execute.startup_timeout = 60
c.Execute.interrupt_on_timeout = True
# ipykernel 7 warns on stderr of every kernel that talks over TCP (a notice, not an error): keep the
# nbgrader commands run here (validate, autograde) free of it.
c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR"]
