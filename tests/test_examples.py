"""The example notebooks run headless, top to bottom, without errors."""

from __future__ import annotations

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("pandas")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["policy_comparison.ipynb"])
def test_notebook_runs(name, tmp_path):
    nb = nbformat.read(EXAMPLES / name, as_version=4)
    client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}})
    client.execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    images = [o for o in outputs if "data" in o and "image/png" in o["data"]]
    assert len(images) >= 2  # the comparison plot and the KV occupancy plot
    tables = [o["data"]["text/html"] for o in outputs if "data" in o and "text/html" in o["data"]]
    assert any("fcfs" in t and "aging" in t and "ttft_p99_s" in t for t in tables)
