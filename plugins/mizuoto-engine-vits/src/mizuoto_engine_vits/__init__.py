"""MMS-TTS (VITS) as a Mizuoto engine: see docs/engines/vits.md."""
