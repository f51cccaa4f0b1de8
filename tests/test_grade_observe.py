"""grader.observe: the harness's channels are the grader's own descriptors, and what it reads is bounded."""

from __future__ import annotations

import os
import sys
import threading
import tracemalloc
from pathlib import Path

from decodesched.grader import observe, verdict
from decodesched.grader.limits import Limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import attacks  # noqa: E402

SCENARIOS = [{"id": "a"}, {"id": "b"}]


def _output(*lines: bytes) -> observe._Output:
    out = observe._Output()
    for line in lines:
        os.write(out.fd, line)
    return out


def _parsed(out: observe._Output, first: bool = True):
    try:
        return observe._parse(out.lines(final=True)[0], SCENARIOS, first=first)
    finally:
        out.close()


def test_honest_lines_parse_as_before():
    out = _output(b'{"load":"ok"}\n{"id":"a","obs":["ok",1]}\n{"id":"b","obs":[null]}\n{"done":2}\n')
    load, done, obs, forged, _, _ = _parsed(out)
    assert (load, done, obs, forged) == ({"load": "ok"}, True, {"a": ["ok", 1], "b": [None]}, [])


def test_a_huge_result_line_is_a_failed_check_read_in_bounded_memory():
    # 63 MiB of empty objects (json.loads: about 1.8 GB of Python objects) for one check, as the harness
    # writes a result line: it is neither parsed nor kept, and that check fails.
    bomb = b'{"id":"a","obs":[' + b"{}," * (63 * 2**20 // 3) + b"{}]}\n"
    out = _output(b'{"load":"ok"}\n', bomb, b'{"id":"b","obs":[1]}\n{"done":2}\n')
    del bomb
    tracemalloc.start()
    try:
        load, done, obs, forged, _, _ = _parsed(out)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, peak
    assert obs == {"a": [{"killed": "its observations were too large to read"}]} and forged == []
    assert not done  # the rest lies past the batch's budget: never read


def test_too_many_objects_on_one_line_are_not_parsed():
    dense = b'{"id":"a","obs":[' + b"{}," * (observe.MAX_CONTAINERS + 10) + b"{}]}\n"
    assert len(dense) < observe.MAX_LINE_BYTES
    tracemalloc.start()
    try:
        _, _, obs, forged, _, _ = _parsed(_output(b'{"load":"ok"}\n', dense, b'{"id":"b","obs":[1]}\n{"done":2}\n'))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 40 * 2**20, peak
    assert obs == {"a": [{"killed": "its observations were too large to read"}], "b": [1]} and forged == []


def test_forged_output_is_named_never_raised():
    cases = {
        b"[" * 200_000 + b"\n": "unreadable line",  # too deep for json.loads: no RecursionError in the grader
        b"x" * (observe.MAX_LINE_BYTES + 1) + b"\n": "an oversized line",
        b'{"id":"a","obs":[]}\n{"load":"ok"}\n': "results before the solution cell had loaded",
        b'{"load":"ok"}\n{"done":1}\n': "a count of 1 checks done, of 2",
    }
    for data, reason in cases.items():
        forged = _parsed(_output(data))[3]
        assert any(f.startswith(reason) for f in forged), (reason, forged)


def test_a_batch_reads_at_most_its_budget():
    out = _output(b'{"id":"a","obs":[1]}\n' * (observe.MAX_OUTPUT_BYTES // 10))
    lines, used = out.lines()
    out.close()
    assert used == observe.MAX_OUTPUT_BYTES and len(lines) < observe.MAX_OUTPUT_BYTES // 20


def _verdict_within(source: str, seconds: float):
    box = []
    t = threading.Thread(target=lambda: box.append(verdict.verdict_for_source(source, limits=Limits(cpu_s=20))),
                         daemon=True)
    t.start()
    t.join(seconds)
    assert box, f"the verdict did not finish in {seconds} s"
    return box[0]


def test_links_and_fifos_in_the_harness_folder_are_never_opened(tmp_path):
    # The honest (buggy) part fails a random trace, so the grader shrinks it through its session: it used to
    # write the batch through `more.fifo` (here a link to another student's notebook) and to wait for ever on
    # `out.jsonl` made a FIFO.
    victim = tmp_path / "victim.ipynb"
    victim.write_text("another student's notebook")
    attack = (f"\nimport os as _os\nfor _name in ('more.fifo', 'out.jsonl'):\n"
              f"    try:\n        _os.unlink(_name)\n    except OSError:\n        pass\n"
              f"_os.symlink({str(victim)!r}, 'more.fifo')\n_os.mkfifo('out.jsonl')\n")
    v = _verdict_within(attacks.honest_source() + attack, 120)
    assert victim.read_text() == "another student's notebook"
    assert v.status == "tampered" and any("more.fifo, out.jsonl" in n for n in v.notes), v.notes
    assert v.total == verdict.verdict_for_source(attacks.honest_source()).total
