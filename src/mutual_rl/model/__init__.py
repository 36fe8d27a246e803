"""The model side of a policy: its config (spec), loading, the run-time wrapper (forward, LoRA, reference) and export."""
