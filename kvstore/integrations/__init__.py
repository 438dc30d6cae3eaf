"""kvstore as the session store of the agent frameworks people already use.

Each adapter is a module of its own and an optional extra, so the core keeps its small set of
dependencies: importing one needs its framework installed (``pip install "kvstore[<extra>]"``).
"""
