"""A fixture distribution for the server's tests: the ``witness`` engine, torch-free, which writes
down what it did (each chunk it yielded, the child it started, its ``finally``) so that a test can
see, from outside the server, how far a stream was computed and whether its cleanup ran. The
server's tests put this folder's parent (``tests/server/server_site``) on the server's PYTHONPATH.
"""
