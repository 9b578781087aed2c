"""`specrouter compare`'s core, apart from its command line: the prompts (prompts.py), the
methods (methods.py: the target alone, auto, fixed chains), running them interleaved on
one clock (runs.py) and their figures (figures.py)."""
