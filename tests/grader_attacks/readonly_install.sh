#!/bin/sh
# A normal (non-editable) install whose site-packages is read-only: init, build and grade a course
# folder of one's own, and show that the installed package is byte for byte unchanged.
#
#     sh tests/grader_attacks/readonly_install.sh [VENV]     (as root: it bind-mounts site-packages
#                                                             read-only in a private mount namespace)
set -eu
REPO=$(cd "$(dirname "$0")/../.." && pwd)
VENV=${1:-$(mktemp -d)/venv}
WORK=$(mktemp -d)
if [ ! -x "$VENV/bin/decodesched" ]; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q "$REPO[grader]"
fi
SITE=$("$VENV/bin/python" -c "import decodesched, os; print(os.path.dirname(os.path.dirname(decodesched.__file__)))")
digest() { (cd "$SITE/decodesched" && find . -type f ! -name '*.pyc' | sort | xargs sha256sum | sha256sum); }
BEFORE=$(digest)
# Submissions: the reference and the untouched release, made from the installed package's own files.
export PATH="$VENV/bin:$PATH" WORK SITE
unshare -m sh -euc '
    mount --bind "$SITE" "$SITE" && mount -o remount,bind,ro "$SITE"
    if touch "$SITE/decodesched/probe" 2>/dev/null; then echo "site-packages is writable"; exit 1; fi
    cd "$WORK"
    decodesched assignment init course
    cd course
    decodesched assignment build
    mkdir ../subs
    python - <<PY
import json
from pathlib import Path
from decodesched.grader import spec
rel = json.loads(Path("release/decode_scheduling/decode_scheduling.ipynb").read_text())
ref = (Path(spec.__file__).parent / "solutions" / "reference.py").read_text()
Path("../subs/release_as_is.ipynb").write_text(json.dumps(rel))
for cell in rel["cells"]:
    if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") == spec.SOLUTION_CELL:
        cell["source"] = ref
Path("../subs/reference.ipynb").write_text(json.dumps(rel))
PY
    decodesched grade ../subs --out ../out --no-progress
    cat ../out/grades.csv
'
AFTER=$(digest)
[ "$BEFORE" = "$AFTER" ] && echo "installed package unchanged: $AFTER"
grep -q "^reference,100,100,graded" "$WORK/out/grades.csv" && grep -q "^release_as_is,0,100," "$WORK/out/grades.csv"
echo "ok: $WORK"
