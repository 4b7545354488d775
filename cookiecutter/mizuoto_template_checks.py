"""Refuse answers the host could not use, right after they are given and before anything is
written, with one message that names the fix.

cookiecutter loads this module as a Jinja extension (``_extensions`` in cookiecutter.json) and
renders the private variables ``__check_slug`` and ``__check_project_slug`` through its filters.
A refusal raises cookiecutter's ``FailedHookException``: the ``cookiecutter`` command prints its
message alone and exits 1, and ``cookiecutter.main.cookiecutter`` raises it. (A failing
``pre_gen_project`` hook would be reported with a traceback and a second, generic message.)
"""

import re

from cookiecutter.exceptions import FailedHookException
from cookiecutter.utils import simple_filter

ENGINE_ID = re.compile(r"[a-z][a-z0-9_-]{0,63}")
DISTRIBUTION = re.compile(r"mizuoto-engine-[a-z0-9][a-z0-9_-]*")


def refuse(message: str) -> FailedHookException:
    return FailedHookException(f"error: {message}; nothing was written")


@simple_filter
def engine_id(slug: str) -> str:
    """``slug`` itself when the host accepts it as an engine id."""
    if slug.startswith("mizuoto-engine"):
        raise refuse(
            f"slug {slug!r}: give the engine id alone (for example 'chime'); the distribution "
            "is named mizuoto-engine-<slug> for you"
        )
    if not ENGINE_ID.fullmatch(slug):
        raise refuse(
            f"slug {slug!r} is not an engine id: use lowercase letters, digits, '-' and '_', "
            "starting with a letter, at most 64 characters (for example 'chime' or 'my-tts')"
        )
    return slug


@simple_filter
def distribution_name(project_slug: str) -> str:
    """``project_slug`` itself when it names an engine distribution and gives a package name."""
    if not DISTRIBUTION.fullmatch(project_slug):
        raise refuse(
            f"project_slug {project_slug!r}: expected 'mizuoto-engine-' followed by lowercase "
            "letters, digits, '-' or '_' (leave it out to get mizuoto-engine-<slug>)"
        )
    package = project_slug.replace("-", "_")
    if not package.isidentifier():
        raise refuse(f"project_slug {project_slug!r} gives the package name {package!r}")
    return project_slug
