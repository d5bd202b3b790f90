"""Evaluation: EM/F1 of a policy or baseline on the test split, tables and plots."""
