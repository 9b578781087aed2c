"""What the router knows, as numbers: the costs of forwards (profiler, profile_cache, costs),
how often one level's tokens survive the next (acceptance), how long answers run (lengths),
and what of it outlives the process (learned, store, persist).

Written only by what learns from cycles (router/learn.py) and by the profiler; the policy
(router/policy/) reads it.
"""
