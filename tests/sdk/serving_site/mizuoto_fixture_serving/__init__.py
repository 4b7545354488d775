"""A fixture distribution for the serving tests: the ``faulty`` engine, torch-free, which streams
seeded noise and misbehaves on request (exits, hangs, is slow, raises) so that tests can run it in
real worker processes and watch a replica fail. A child process finds it with this folder's parent
(``tests/sdk/serving_site``) on PYTHONPATH and in ``Discovery(path=[...])``.
"""
