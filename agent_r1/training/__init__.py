"""DeepSpeed training infrastructure: the trained models, token log-probs, the RL update and loop, checkpoints.

Importing it has no side effect: deepspeed is imported inside the functions that
need it, right after :func:`agent_r1.accelerator.select_accelerator`.
"""
