"""What the tests share beside their fixtures: the K/V model on a cache (``kvmodel``), the Store contract every store
passes (``store_suite``), stores that count or fail calls, the S3 server fixture, TVM's reference cache and the
README snippets' runner. Importable as ``support.<module>`` (pyproject puts ``tests/`` on the path)."""
