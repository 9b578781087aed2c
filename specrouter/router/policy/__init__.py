"""The router's policy: decide(inputs, session_state, config) -> Decision (decide.py).

No I/O and no clock: the chain of a cycle is a function of what is known before it
(CycleInputs and the estimates the planner reads), what the policy remembers of the request
(SessionState) and the tuning (RouterConfig). Its parts: the predictor (seconds per token of a
chain), the plan and planner (draft lengths per candidate chain, re-planned when the inputs
move), the guards (caution and hysteresis), the probes, the pacing (when a recent decision is
reused), and the record --explain shows.
"""
