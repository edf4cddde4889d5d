"""Development tooling shared by the demo, the tests and the benchmarks (never imported by the
server package ``cerebro_db``, never installed into the server's environment)."""
