"""Engine ``memo``: a stack of Linear layers whose handle the host's memory manager places.

Models ``a`` and ``b`` differ only in their random weights. Load options: ``plain_module`` hands
the host the torch module instead of a ModelHandle, ``not_a_handle`` hands it a string. Request
params: ``chunks`` (how many chunks, each one forward through the stack) and ``mode="oom"``
(raise an out-of-memory error instead).
"""
