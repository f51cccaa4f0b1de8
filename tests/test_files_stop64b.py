"""An existing output file its user may not write (`chmod a-w`) is refused, not replaced by the rename."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from decodesched._io import OutputError, output_target

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grader_attacks import nobody  # noqa: E402

AZURE = Path(__file__).resolve().parent / "data" / "azure_llm_2023_code_head60.csv"


@pytest.mark.skipif(nobody.available() is not None, reason=str(nobody.available()))
def test_a_read_only_output_is_refused_and_kept_for_an_ordinary_user():
    """As uid 65534: `trace convert --out t.csv` over a `chmod 444` t.csv of the user's own replaced it (mode 444
    kept, the old content gone); now one line naming it, exit 2, the file and its folder as they were."""
    base = nobody.workdir()
    try:
        shutil.copy(AZURE, base / "azure.csv")
        (base / "t.csv").write_text("precious\n")
        nobody.give(base)
        os.chmod(base / "t.csv", 0o444)
        before = sorted(os.listdir(base))
        proc = nobody.run(["-m", "decodesched.cli", "trace", "convert", "azure.csv", "--load", "1", "--out", "t.csv"], cwd=base)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "t.csv" in lines[0] and "read-only" in lines[0], proc.stderr
        assert (base / "t.csv").read_text() == "precious\n"
        assert sorted(os.listdir(base)) == before
        # a new name in the same folder is written as before
        proc = nobody.run(["-m", "decodesched.cli", "trace", "convert", "azure.csv", "--load", "1", "--out", "u.csv"], cwd=base)
        assert proc.returncode == 0, proc.stderr
        assert (base / "u.csv").read_text().startswith("request_id,")
    finally:
        nobody.cleanup(base)


def test_output_target_names_a_file_the_process_may_not_write(tmp_path, monkeypatch):
    """The rule itself, with `os.access` answering as it does for a user without write permission."""
    f = tmp_path / "r.csv"
    f.write_text("x\n")
    link = tmp_path / "l.csv"
    link.symlink_to(f)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == f and mode == os.W_OK
                        else real(p, mode, **kw))
    for given in (f, link):
        with pytest.raises(OutputError, match="read-only"):
            output_target(given)
    assert output_target(tmp_path / "new.csv") == tmp_path / "new.csv"
