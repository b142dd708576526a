"""finetune_trainer: the trainer that runs inside every FineTuneJob pod.

The launcher (`finetune-trainer`, PID 1 of the pod) validates the mounted config and the env contract, runs the
distributed preflight and starts `torchrun`; each torchrun worker runs :mod:`finetune_trainer.worker`.
"""

__version__ = "0.1.0"
