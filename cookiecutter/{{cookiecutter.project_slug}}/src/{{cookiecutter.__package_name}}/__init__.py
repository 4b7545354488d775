{{ '"""' ~ (cookiecutter.description.replace('\\', '/').replace('"', "'") | wordwrap(90, true, "\n")) ~ '"""' }}
