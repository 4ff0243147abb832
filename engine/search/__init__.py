"""The search over a target's space: the loop that asks and tells (search), the samplers
(grid, random and optuna's, samplers), optuna studies in the store (studies, trials). Imports
execute and below.
"""
