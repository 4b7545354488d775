"""The engine is installed where the host looks for it, and the host accepts what it declares."""

from importlib.metadata import entry_points

from mizuoto_sdk import Engine
from mizuoto_sdk.host import discover

ENGINE_ID = {{ cookiecutter.slug | tojson }}
DISTRIBUTION = "{{ cookiecutter.project_slug }}"


def test_the_entry_point_names_the_plugin_module():
    [entry] = [ep for ep in entry_points(group="mizuoto.engines") if ep.name == ENGINE_ID]
    assert entry.value == "{{ cookiecutter.__package_name }}.plugin"
    assert entry.dist is not None and entry.dist.name == DISTRIBUTION


def test_discovery_lists_the_engine_as_ok():
    record = discover().record(ENGINE_ID)  # raises, saying why, unless its status is ok
    assert record.ok and record.distribution == DISTRIBUTION
{%- if cookiecutter.capabilities == "synthesize+convert" %}
    assert record.manifest.capabilities == ("synthesize", "convert")
{%- else %}
    assert record.manifest.capabilities == ("synthesize",)
{%- endif %}


def test_the_engine_class_imports_and_agrees_with_the_manifest():
    # get_engine raises EngineUnavailable when the class sets DEVICES, DTYPES or EXTRAS and they
    # differ from the manifest's; unset, the class it returns carries the manifest's values.
    discovery = discover()
    engine, manifest = discovery.get_engine(ENGINE_ID), discovery.manifest(ENGINE_ID)
    assert issubclass(engine, Engine)
    assert (manifest.devices, manifest.dtypes) == (engine.DEVICES, engine.DTYPES)
