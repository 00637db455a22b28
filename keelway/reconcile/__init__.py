"""Reconciliation: converge an instance's records and processes after anything.

`plan` decides with no I/O; `apply` carries a plan out. Reconciling twice equals
reconciling once: every action is idempotent and marks what it converged.
"""
