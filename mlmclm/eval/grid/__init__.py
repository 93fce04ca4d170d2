"""The evaluation grid as units of work shared by many workers, on many nodes, through one output folder: what a
unit is and costs (units.py, cost.py), who holds it (claims.py), the loop each worker runs (worker.py), the
processes of one command (pool.py), what the folder says of the grid (status.py), and `run_grid` (run.py).
The contract every command keeps: docs/evaluation.md, "Many runs at once"."""
