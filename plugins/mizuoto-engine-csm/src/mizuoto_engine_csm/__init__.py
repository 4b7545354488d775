"""Sesame CSM (transformers' CsmForConditionalGeneration), built from mizuoto_runtime."""
