"""Refuse answers the host could not use, before anything is written, naming the fix."""

import re
import sys

SLUG = {{ cookiecutter.slug | tojson }}
PROJECT = {{ cookiecutter.project_slug | tojson }}
PACKAGE = {{ cookiecutter.__package_name | tojson }}

problems = []
if not re.fullmatch(r"[a-z][a-z0-9_-]{0,63}", SLUG):
    problems.append(
        f"slug {SLUG!r} is not an engine id: use lowercase letters, digits, '-' and '_', "
        "starting with a letter, at most 64 characters (for example 'hum' or 'my-tts')"
    )
elif SLUG.startswith("mizuoto-engine"):
    problems.append(
        f"slug {SLUG!r}: give the engine id alone (for example 'hum'); the distribution is "
        "named mizuoto-engine-<slug> for you"
    )
if not re.fullmatch(r"mizuoto-engine-[a-z0-9][a-z0-9_-]*", PROJECT):
    problems.append(
        f"project_slug {PROJECT!r}: expected 'mizuoto-engine-' followed by lowercase letters, "
        "digits, '-' or '_' (the default, mizuoto-engine-<slug>, always works)"
    )
elif not PACKAGE.isidentifier():
    problems.append(f"project_slug {PROJECT!r} gives the package name {PACKAGE!r}, not an identifier")

if problems:
    print("\n".join(f"error: {p}" for p in problems), file=sys.stderr)
    sys.exit(1)
