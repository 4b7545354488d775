"""Engines that need programs and libraries beyond Python packages (torch-free, CPU only).

``has-sh`` needs ``sh`` and libc, which every test machine has; ``lacks-program`` needs a program
no machine has; ``lacks-library`` needs a shared library no machine has; ``probed`` asks its own
probe, which answers that the program is too old.
"""
