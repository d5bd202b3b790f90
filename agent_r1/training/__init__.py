"""DeepSpeed training infrastructure: engines, models, token log-probs, checkpoints.

Importing this package sets ``DS_ACCELERATOR=cpu`` when there is no CUDA
device, before deepspeed is imported (see :mod:`agent_r1.training.distributed`).
"""

from agent_r1.training.distributed import select_accelerator

select_accelerator()
