"""A fixture distribution whose engine never imports torch, as an engine wrapping a command-line
synthesizer (espeak-ng and the like) does: its manifest says ``uses_torch=False``, and each chunk
comes from a child process that prints raw float32 PCM, run through ``ctx.run_process``.
"""
