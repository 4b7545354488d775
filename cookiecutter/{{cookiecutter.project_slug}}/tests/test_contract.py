"""The Mizuoto contract, one test per check: ``pytest -k stream.cancel`` runs one of them.

A failing check names its rule, what it expected, what it saw and how to fix it.
{%- if cookiecutter.uses_torch %} ``pytest
--mizuoto-device cuda`` runs the checks on another device.
{%- endif %}
"""

from mizuoto_contract import parametrize_contract


@parametrize_contract({{ cookiecutter.slug | tojson }})
def test_contract(contract_case, mizuoto_device):
    contract_case.run(device=mizuoto_device)
