"""finetune-operator: Hugging Face fine-tuning as multi-node FineTuneJobs on Kubernetes."""

__version__ = "0.1.0"
