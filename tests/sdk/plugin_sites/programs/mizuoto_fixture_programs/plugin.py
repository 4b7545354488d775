"""Declares the four engines of ``mizuoto-fixture-programs``."""

from mizuoto_sdk import EngineManifest, Library, ModelEntry, Program, hookimpl

MISSING_PROGRAM = "mizuoto-fixture-no-such-program"


def _manifest(engine_id, programs=(), libraries=()):
    return EngineManifest(
        id=engine_id,
        implementation="mizuoto_fixture_programs.engine:ProgramEngine",
        models=[ModelEntry("tiny")],
        capabilities=["synthesize"],
        devices=["cpu"],
        uses_torch=False,
        programs=programs,
        libraries=libraries,
    )


@hookimpl
def mizuoto_engines():
    return [
        _manifest(
            "has-sh",
            programs=[Program("sh", install="apt install dash")],
            libraries=[Library("c", install="apt install libc6")],
        ),
        _manifest(
            "lacks-program",
            programs=[
                Program("sh", install="apt install dash"),
                Program(MISSING_PROGRAM, install="apt install espeak-ng"),
            ],
        ),
        _manifest(
            "lacks-library",
            libraries=[Library("mizuoto_fixture_no_such_lib", install="apt install libnothing1")],
        ),
        _manifest(
            "probed",
            programs=[
                Program(
                    "espeak-ng",
                    install="pip install espeak-ng-binary",
                    probe="mizuoto_fixture_programs.checks:espeak_ok",
                )
            ],
        ),
    ]
