"""The check reference page, generated from the registry so that it cannot drift from the code.

python -m mizuoto_contract.reference > docs/contract-checks.md
"""

from __future__ import annotations

import sys

from mizuoto_contract.checks import ALL


def render() -> str:
    lines = [
        "# Contract checks",
        "",
        "Generated from the check registry (`python -m mizuoto_contract.reference`); do not edit.",
        "",
        "Run them with `mizuoto-contract ENGINE`. A check whose `needs` the engine lacks is",
        "skipped and does not fail the run; a check skipped for any other reason (it could not",
        "run, or an earlier failure it `requires` already reports the cause) fails the run. An",
        "engine that knowingly breaks a rule lists the check id with a reason in its manifest's",
        "`expected_failures`; it is then reported as xfail, and as a failure if it passes.",
        "",
        "| id | tier | rule |",
        "| --- | --- | --- |",
        *(f"| `{c.id}` | {c.tier} | {c.rule} |" for c in ALL),
    ]
    for check in ALL:
        lines += [
            "",
            f"## `{check.id}`",
            "",
            f"**Rule.** {check.rule}",
            "",
            f"**Why.** {check.why}",
            "",
            f"**How to fix.** {check.fix}",
        ]
        if check.needs:
            lines += ["", f"**Needs.** {', '.join(check.needs)}"]
        if check.requires:
            lines += ["", f"**Skipped when these fail.** {', '.join(check.requires)}"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
