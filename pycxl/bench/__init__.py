"""Benchmarks on memory tiers; each returns result objects and prints nothing."""
