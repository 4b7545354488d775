"""The ``fetched`` engine: ``call("files")`` lists the files of the folder it was loaded from."""

from mizuoto_sdk import Engine, LoadedEngine


class Files(LoadedEngine):
    def __init__(self, folder):
        self.folder = folder

    def call(self, op, payload, ctx):
        return sorted(
            str(p.relative_to(self.folder)) for p in self.folder.rglob("*") if p.is_file()
        )


class Fetched(Engine):
    def load(self, spec, runtime, ctx):
        return Files(spec.model_dir)
