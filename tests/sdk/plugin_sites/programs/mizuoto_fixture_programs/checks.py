"""Probes: None when the program is usable, else why not. Cheap, and never import torch."""


def espeak_ok():
    return "espeak-ng 1.49 is too old; 1.51 or newer is needed"


def fine():
    return None


def raises():
    raise OSError("cannot run espeak-ng --version")


def answers_a_number():
    return 3
