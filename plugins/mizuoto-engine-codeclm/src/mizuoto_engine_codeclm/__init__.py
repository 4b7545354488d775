"""A codec-language-model TTS engine for Mizuoto, built only from mizuoto_runtime."""
