"""Running the plan: the runner that builds and measures a candidate (runner, evaluation,
datasets), the executor protocol (protocol) and its local and Ray implementations (executor,
pool, worker, serve, ray_executor), the timing gate (gate), isolated environments (environments) and what
starts before the pool (prestart), the events a run emits (hooks) and the output folder's rules
(outdir). Imports select, plan, store and below.
"""
