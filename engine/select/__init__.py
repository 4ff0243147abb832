"""Choosing: each candidate's result (results), constraints judged on their intervals and the
objective ranked with ties (select), the Pareto front of several objectives (front). Imports the
plan, the store, engine.text and below.
"""
