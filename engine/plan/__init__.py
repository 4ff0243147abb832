"""The plan: what each target's search space holds (space), the jobs and candidates a point
stands for and the DAG they form (planner, jobs), and the content keys that name every job,
evaluation and dataset (keys). Imports engine.workflow, engine.registry, engine.text and
engine.core; nothing that runs anything.
"""
