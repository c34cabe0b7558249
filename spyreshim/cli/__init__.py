"""The `spyreshim` command line and what it runs: `run`'s environment (launch), `doctor`, `snapshot` (control)."""
