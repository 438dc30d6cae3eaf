"""kvstore's benchmarks: each module measures kvstore against baselines in one run.

Run every benchmark with ``python -m benchmarks``, or one with ``python -m benchmarks.<name>``.
Results are written as JSON under ``benchmarks/results/`` (git-ignored) unless ``--json`` says
otherwise. docs/BENCHMARKS.md explains what each figure means.
"""
