"""Readers for model files from other ecosystems that need none of those ecosystems' packages."""
