"""The benchmarks: ``kvckpt bench`` (export, save, generate, chat, soak), ``make bench-peers`` and
``make bench-browser``, and the development benchmarks beside them. How they measure: ``bench/README.md``."""
