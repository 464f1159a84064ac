"""The ``kvckpt`` command line: its arguments, and the demo and chat it runs (the benchmarks: ``kvckpt_web.bench``)."""
