"""What a newcomer reads against what the commands do: help texts, table units, readable figures."""

import pytest

from decodesched.cli import main
from decodesched.trace import TRACE_COLUMNS


def _help(capsys, *words):
    with pytest.raises(SystemExit) as exc:
        main([*words, "--help"])
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_grade_help_uses_the_readmes_names(capsys):
    # README: `decodesched grade SUBMISSIONS --out DIR [--course DIR] [--jobs N] [--timeout S] [--memory-mb M]`,
    # and the help's own description writes DIR/grades.csv
    out = _help(capsys, "grade")
    for name in ("SUBMISSIONS", "--out DIR", "--jobs N", "--timeout S", "--memory-mb M"):
        assert name in out, name
    assert "--out OUT" not in out


def test_assignment_actions_have_a_description(capsys):
    assert "nbgrader course into DIR" in " ".join(_help(capsys, "assignment", "init").split())
    assert "a build that fails leaves the release as it was" in " ".join(_help(capsys, "assignment", "build").split())


def test_report_help_is_wrapped(capsys):
    description = _help(capsys, "report").split("\n\n")[1]  # (after the usage block)
    assert description.startswith("Write PNG plots") and max(map(len, description.splitlines())) <= 100


def _row(sps):
    return {"trace": "t", "policy": "aging", "replicate": 0, "kv_blocks": 8, "aging_interval": 4,
            "finished": 3, "unfinished": 0, "unservable": 0, "steps_per_second": sps,
            "queue_wait_p95": 200.0, "queue_wait_p95_s": 2.0, "ttft_p95": 300.0, "ttft_p95_s": 3.0,
            "e2e_p99": 400.0, "e2e_p99_s": 4.0, "starvation": 500.0, "starvation_s": 5.0,
            "preemptions": 1, "deadline_miss_rate": 0.25}


def test_sweep_table_names_its_units():
    from decodesched.commands.sweep import format_rows
    timed = format_rows([_row(100.0)])
    assert "ttft P95 (s)" in timed and "starve (s)" in timed and "dl miss rate" in timed
    assert timed.splitlines()[1].split()[8:12] == ["2", "3", "4", "5"]  # the seconds twins
    assert "(steps)" in format_rows([_row(100.0), _row(float("nan"))])  # a trace without a time scale: steps
    steps = format_rows([_row(None)])
    assert "ttft P95 (steps)" in steps
    assert steps.splitlines()[1].split()[8:12] == ["200", "300", "400", "500"]


def test_simulate_names_the_aging_interval_only_where_it_counts(tmp_path, capsys):
    p = tmp_path / "trace.csv"
    p.write_text(",".join(TRACE_COLUMNS) + "\n1,0,4,3,0,false,2,,true\n2,1,2,2,2,true,2,8,true\n")
    assert main(["simulate", str(p), "--policy", "fixed_priority", "--kv-blocks", "4"]) == 0
    assert "aging interval" not in capsys.readouterr().out.splitlines()[0]
    assert main(["simulate", str(p), "--policy", "aging", "--kv-blocks", "4", "--aging-interval", "3"]) == 0
    assert "aging interval 3" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize("base", [10, 2])


def test_report_log_axes_have_plain_tick_labels(tmp_path, base):
    from decodesched import report
    fig, axes = report._figure()
    ax = axes[0][0]
    with report._plain_text():
        ax.plot([1, 2, 3], [0.01, 10.0, 1000.0])
        ax.set_yscale("log", base=base)
        report._save(fig, tmp_path, report.Plot("p", "p"))
        labels = [t.get_text() for t in ax.get_yticklabels() if t.get_text()]

    assert labels and not any("$" in t or "mathdefault" in t for t in labels), labels
    assert (tmp_path / "p.png").stat().st_size > 0
