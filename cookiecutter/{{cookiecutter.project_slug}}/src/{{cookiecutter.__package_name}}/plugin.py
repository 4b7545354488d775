{#- A Python string literal quoted the way ruff format quotes it: double, unless that escapes more. -#}
{%- macro literal(text) -%}
{%- if text.count('"') > text.count("'") -%}
'{{ text.replace("\\", "\\\\").replace("'", "\\'") }}'
{%- else -%}
"{{ text.replace("\\", "\\\\").replace('"', '\\"') }}"
{%- endif -%}
{%- endmacro -%}
"""Entry point module: declares the engine without importing it, or torch.

``mizuoto engines`` imports this module (and every other plugin's) to list what is installed, so
it stays this small: the manifest names the implementation as a string, imported only when the
engine is used.
"""

from mizuoto_sdk import EngineManifest, ModelEntry, Param, hookimpl


@hookimpl
def mizuoto_engines() -> list[EngineManifest]:
    return [
        EngineManifest(
            id={{ cookiecutter.slug | tojson }},
            name={{ literal(cookiecutter.engine_name) }},
            implementation="{{ cookiecutter.__package_name }}.engine:{{ cookiecutter.__class_prefix }}Engine",
            # Replace: one ModelEntry per checkpoint. Its files ("package:folder" inside an
            # installed package, or an absolute path) reach Engine.load as spec.model_dir.
            models=[ModelEntry("tiny", description="stand-in weights from a fixed seed")],
{%- if cookiecutter.capabilities == "synthesize+convert" %}
            capabilities=["synthesize", "convert"],
{%- else %}
            capabilities=["synthesize"],
{%- endif %}
{%- if cookiecutter.uses_torch %}
            devices=["cpu", "cuda", "mps", "xpu"],
            dtypes=["float32", "bfloat16", "float16"],  # preference order
{%- else %}
            devices=["cpu"],
            dtypes=["float32"],
            uses_torch=False,  # numpy only: it runs where torch is not installed
{%- endif %}
            stochastic=True,  # the seed changes the audio (determinism.seed_matters checks it)
            # Every request param the engine reads, declared once: the host checks each request
            # against these before the engine runs (an InvalidRequest naming params.<name>) and
            # hands the engine the checked values, defaults filled in. seed is the host's own.
            params=[
                Param("speed", "float", 1.0, minimum=0.25, maximum=4, help="speaking rate"),
{%- if cookiecutter.capabilities == "synthesize+convert" %}
                Param(
                    "drive",
                    "float",
                    1.0,
                    minimum=0.1,
                    maximum=10,
                    help="convert: gain before the soft clipping",
                ),
{%- endif %}
            ],
{%- set description = literal(cookiecutter.description) %}
{%- if description | length <= 75 %}
            description={{ description }},
{%- else %}
            description=(
{%- for piece in (cookiecutter.description | wordwrap(64, true, "\n")).split("\n") %}
                {{ literal(piece ~ ("" if loop.last else " ")) }}
{%- endfor %}
            ),
{%- endif %}
        )
    ]
