"""Head training: Medusa-1 on a frozen backbone, Medusa-2 with the backbone (LoRA, self-distillation)."""
