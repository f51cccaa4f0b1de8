"""One colour (and line style) per policy, the same in every figure: the demo, the report, notebooks.

>>> policy_color("aging"), policy_style("fcfs")
('#2ca02c', '--')
>>> policy_colors(["my_sjf", "fcfs", "lst"])
{'fcfs': '#7f7f7f', 'lst': '#ff7f0e', 'my_sjf': '#9467bd'}
"""

from __future__ import annotations

from typing import Iterable

POLICY_ORDER = ("fixed_priority", "aging", "deadline", "fcfs")
BUILTIN_COLORS = {"fixed_priority": "#1f77b4", "aging": "#2ca02c", "deadline": "#d62728", "fcfs": "#7f7f7f"}
BUILTIN_MARKERS = {"fixed_priority": "o", "aging": "s", "deadline": "^", "fcfs": "D"}
# Other policies (custom ones): these, in the order of their names, so a name keeps its colour
# across figures of one report.
EXTRA_COLORS = ("#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#bcbd22", "#17becf")
EXTRA_MARKERS = ("v", "P", "X", "*", "h", "<")


def sorted_policies(policies: Iterable[str]) -> list[str]:
    """Built-ins first in `POLICY_ORDER`, then the others by name; each once (any iterable)."""
    names = list(dict.fromkeys(policies))
    return [p for p in POLICY_ORDER if p in names] + sorted(p for p in names if p not in POLICY_ORDER)


def policy_colors(policies: Iterable[str]) -> dict[str, str]:
    """A colour for each policy: the built-ins' fixed ones, the others' by their rank among the others."""
    others = [p for p in sorted_policies(policies) if p not in BUILTIN_COLORS]
    out = {}
    for p in sorted_policies(policies):
        out[p] = BUILTIN_COLORS.get(p) or EXTRA_COLORS[others.index(p) % len(EXTRA_COLORS)]
    return out


def policy_color(policy: str, policies: Iterable[str] = ()) -> str:
    """The colour of `policy` among `policies` (needed only for custom policies)."""
    return policy_colors([*policies, policy])[policy]


def policy_marker(policy: str, policies: Iterable[str] = ()) -> str:
    others = [p for p in sorted_policies([*policies, policy]) if p not in BUILTIN_MARKERS]
    return BUILTIN_MARKERS.get(policy) or EXTRA_MARKERS[others.index(policy) % len(EXTRA_MARKERS)]


def policy_style(policy: str) -> str:
    """The line style: dashed for the fcfs baseline, solid for the rest."""
    return "--" if policy == "fcfs" else "-"
