"""CPU-sized checks for `make demo` and the mini-replication: the embedded smoke tasks of all four families, their
small-budget evaluation, and fill-mask scoring on held-back text. The top room: may import every other one."""
