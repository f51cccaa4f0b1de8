"""decodesched grade / assignment: bad input exits 2 with one line on stderr, nothing written."""

from __future__ import annotations

import pytest

from decodesched import cli


def test_cli_bad_input_exits_2_without_output(tmp_path, capsys):
    out = tmp_path / "out"
    assert cli.main(["grade", str(tmp_path / "missing"), "--out", str(out)]) == 2
    assert cli.main(["grade", str(tmp_path)]) == 2
    (tmp_path / "a.ipynb").write_text("{}")
    assert cli.main(["grade", str(tmp_path), "--out", str(out), "--course", str(tmp_path / "nocourse")]) == 2
    assert cli.main(["grade", str(tmp_path / "a.ipynb"), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("decodesched grade: error:") == 4 and "Traceback" not in err
    assert "missing: no such folder" in err and "a.ipynb: not a folder of submissions" in err
    assert not out.exists()


@pytest.mark.parametrize("option,value", [
    ("--timeout", "nan"), ("--timeout", "inf"), ("--timeout", "-5"), ("--timeout", "0"), ("--timeout", "1e9"),
    ("--timeout", "soon"), ("--cell-timeout", "nan"), ("--cell-timeout", "-1"), ("--memory-mb", "12"),
    ("--memory-mb", "1e3"), ("--memory-mb", "99999999999"), ("--jobs", "-1"), ("--jobs", "100000"),
])
def test_absurd_limits_exit_2_with_one_line(tmp_path, capsys, option, value):
    with pytest.raises(SystemExit) as exc:
        cli.main(["grade", str(tmp_path), "--out", str(tmp_path / "out"), f"{option}={value}"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and option in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_no_course_folder_says_to_run_init(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "subs").mkdir()
    assert cli.main(["grade", "subs", "--out", "out"]) == 2
    assert cli.main(["assignment", "build"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all("assignment init" in line for line in err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["subs"]


def test_assignment_init_refuses_a_non_empty_folder(tmp_path, capsys):
    (tmp_path / "x").write_text("mine")
    assert cli.main(["assignment", "init", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not empty" in err[0]
    assert [p.name for p in tmp_path.iterdir()] == ["x"]


def test_without_nbgrader_grade_and_build_say_which_extra_to_install(tmp_path, capsys, monkeypatch):
    # A plain `pip install .` has no nbgrader: `grade` ran every check and then ended in a traceback
    # at the gradebook (ModuleNotFoundError), after minutes of work.
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "nbgrader" else find_spec(name, *a))
    assert cli.main(["assignment", "init", str(tmp_path / "course")]) == 0
    (tmp_path / "subs").mkdir()
    (tmp_path / "subs" / "alice.ipynb").write_text("{}")
    out = tmp_path / "out"
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(out), "--course", str(tmp_path / "course")]) == 2
    assert cli.main(["assignment", "build", "--course", str(tmp_path / "course")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"decodesched {c}: error: decodesched {c} needs nbgrader, which is not installed: "
                   "pip install 'decodesched[grader]'" for c in ("grade", "assignment build")]
    assert not out.exists() and not (tmp_path / "course" / "release").exists()


@pytest.mark.parametrize("root, userns, noted", [(True, False, False), (False, True, False), (False, False, True)])
def test_grade_says_once_when_submissions_would_run_with_the_graders_own_access(tmp_path, capsys, monkeypatch,
                                                                               root, userns, noted):
    from decodesched.grader import pipeline, sandbox

    monkeypatch.setattr(sandbox, "is_root", lambda: root)
    monkeypatch.setattr(sandbox, "userns_available", lambda: userns)
    monkeypatch.setattr(pipeline, "grade", lambda *a, **k: [])  # the notice, not the grading
    assert cli.main(["assignment", "init", str(tmp_path / "course")]) == 0
    (tmp_path / "subs").mkdir()
    capsys.readouterr()
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"),
                     "--course", str(tmp_path / "course")]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == (["decodesched grade: note: submissions run with your own access to files here (neither root nor "
                    "user namespaces): they can read the course and write where you can; see docs/grading.md"]
                   if noted else [])
    # bad input is still one line, the error alone
    assert cli.main(["grade", str(tmp_path / "subs"), "--out", str(tmp_path / "out"),
                     "--course", str(tmp_path / "no-course")]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


@pytest.mark.parametrize("option, value", [("--jobs", "\u0663"), ("--jobs", "1_0"), ("--memory-mb", "\uff16\uff14"),
                                           ("--timeout", "1_0"), ("--cell-timeout", "\u0665"), ("--timeout", "inf")])
def test_grade_numbers_are_spelled_as_every_other_option(tmp_path, capsys, option, value):
    """`int`/`float` take `1_0` and other scripts' digits; grade's options took them (`--jobs ٣` ran 3 jobs), where
    every other command's options and every trace file refuse them in one line."""
    with pytest.raises(SystemExit) as info:
        cli.main(["grade", str(tmp_path), "--out", str(tmp_path / "out"), f"{option}={value}"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and f"argument {option}: expected" in err
    assert not (tmp_path / "out").exists()
