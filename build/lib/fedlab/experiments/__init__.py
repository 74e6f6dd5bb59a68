"""One module per chapter: the sweeps and tables a chapter runs, built from fedlab's algorithms.

Nothing else in fedlab imports from here (imports run experiments -> attacks -> fl -> privacy, data,
models, metrics -> config; ``tests/test_architecture.py`` checks it).
"""
